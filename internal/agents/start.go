package agents

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"

	"sandboxd/internal/agentrun"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// validateAgentRun checks a start request against the product's rules, before anything is
// looked up or written.
func (s *Service) validateAgentRun(req sandbox.AgentRunRequest) (sandbox.AgentConfig, error) {
	bad := func(field, format string, args ...any) error {
		return apierror.New(apierror.InvalidArgument, format, args...).WithDetail("field", field)
	}
	if req.PassAtK < 0 {
		return sandbox.AgentConfig{}, bad("pass_at_k", "pass_at_k must be at least 1, got %d", req.PassAtK)
	}
	if req.SandboxID != "" && req.PassAtK > 1 {
		return sandbox.AgentConfig{}, bad("pass_at_k", "sandbox_id with pass_at_k > 1 is rejected: independent, graded attempts do not attach to a sandbox; use Harbor for them")
	}
	if req.SandboxID == "" {
		return sandbox.AgentConfig{}, bad("sandbox_id", "sandbox_id is required: an agent run attaches to a running sandbox (use Harbor for independent, graded attempts)")
	}
	if req.AgentID == "" {
		return sandbox.AgentConfig{}, bad("agent_id", "agent_id is required")
	}
	a, ok := s.agents[req.AgentID]
	if !ok {
		ids := make([]string, 0, len(s.cfg.Agents))
		for _, a := range s.cfg.Agents {
			ids = append(ids, a.ID)
		}
		return sandbox.AgentConfig{}, bad("agent_id", "unknown agent %q (the catalog has: %s)", apierror.Truncate(req.AgentID, 64), strings.Join(ids, ", "))
	}
	if !slices.Contains(a.Integrations, sandbox.IntegrationSandbox) {
		return sandbox.AgentConfig{}, bad("agent_id", "agent %q has integrations [%s]: only catalog agents with integration: sandbox attach to a running sandbox",
			a.ID, strings.Join(a.Integrations, ", "))
	}
	if len(req.Model) > maxModelBytes || strings.ContainsFunc(req.Model, unicode.IsControl) {
		return sandbox.AgentConfig{}, bad("model", "model must be at most %d bytes without control characters", maxModelBytes)
	}
	if req.Model == "" && a.UsesModel() {
		return sandbox.AgentConfig{}, bad("model", "model is required by agent %q", a.ID)
	}
	if strings.TrimSpace(req.Instruction) == "" {
		return sandbox.AgentConfig{}, bad("instruction", "instruction is required")
	}
	if l := s.cfg.Limits.AgentMaxInstructionBytes; len(req.Instruction) > l {
		return sandbox.AgentConfig{}, apierror.New(apierror.PayloadTooLarge, "instruction is %d bytes, at most %d", len(req.Instruction), l).
			WithDetail("field", "instruction")
	}
	if len(bytes.TrimSpace(req.Config)) > 0 {
		if l := s.cfg.Limits.AgentMaxConfigBytes; len(req.Config) > l {
			return sandbox.AgentConfig{}, apierror.New(apierror.PayloadTooLarge, "config is %d bytes, at most %d", len(req.Config), l).
				WithDetail("field", "config")
		}
		var obj map[string]any
		if err := json.Unmarshal(req.Config, &obj); err != nil || obj == nil {
			return sandbox.AgentConfig{}, bad("config", "config must be a JSON object")
		}
	}
	return a, nil
}

// StartAgentRun starts a catalog agent inside the caller's running sandbox: it uploads the
// instruction and config into /workspace/.agent-runs/<run id>/, checks that the agent's
// binary is in the image (a run without it is FAILED at once, with that reason) and starts the
// agent as a detached exec. It answers with the run (RUNNING, or FAILED); the agent runs on
// after the request, and the sandbox stays alive afterwards.
func (s *Service) StartAgentRun(ctx context.Context, p auth.Principal, req sandbox.AgentRunRequest) (sandbox.AgentRun, error) {
	runs, err := s.runStore()
	if err != nil {
		return sandbox.AgentRun{}, err
	}
	agent, err := s.validateAgentRun(req)
	if err != nil {
		return sandbox.AgentRun{}, err
	}
	rec, err := s.sandboxes.Load(ctx, p, req.SandboxID, sandbox.VerbExec)
	if err != nil {
		return sandbox.AgentRun{}, err
	}
	id := sandbox.NewID(runPrefix)
	r := agentrun.Record{ID: id, Tenant: rec.Tenant, Project: rec.Project, Sandbox: rec.ID, Agent: agent.ID,
		Model: req.Model, RunDir: RunsDir + "/" + id, CreatedAt: s.now().UTC()}
	if err := runs.Create(ctx, r); err != nil {
		return sandbox.AgentRun{}, apierror.Wrap(err, apierror.Unavailable, "could not record the agent run; retry").WithRetryAfter(time.Second)
	}
	// From here on the run exists: whatever fails makes it FAILED with the reason.
	fail := func(reason string) (sandbox.AgentRun, error) {
		s.finishRun(r.ID, sandbox.RunFailed, reason, -1, "")
		return s.GetAgentRun(context.WithoutCancel(ctx), p, r.ID)
	}
	cfg := req.Config
	if len(bytes.TrimSpace(cfg)) == 0 {
		cfg = json.RawMessage("{}")
	}
	if _, err := s.sandboxes.WriteFile(ctx, p, rec.ID, r.RunDir+"/instruction.md", 0o644, strings.NewReader(req.Instruction)); err != nil {
		return s.failStart(fail, err, "could not upload the instruction")
	}
	if _, err := s.sandboxes.WriteFile(ctx, p, rec.ID, r.RunDir+"/config.json", 0o644, bytes.NewReader(cfg)); err != nil {
		return s.failStart(fail, err, "could not upload the config")
	}
	check := int64(binaryCheckSec)
	res, err := s.execs.Exec(ctx, p, rec.ID, sandbox.ExecRequest{Command: []string{"sh", "-c", `command -v -- "$1" >/dev/null 2>&1`, "sh", agent.Binary},
		TimeoutSec: &check})
	if err != nil {
		return s.failStart(fail, err, "could not check for the agent's binary")
	}
	if res.ExitCode != 0 || res.Error != "" {
		return fail(missingBinary(agent.Binary))
	}
	if cur, err := runs.Get(ctx, r.ID); err == nil && cur.Cancelled {
		s.finishRun(r.ID, sandbox.RunCancelled, "cancelled before the agent started", -1, "")
		return s.GetAgentRun(ctx, p, r.ID)
	}
	env := map[string]string{}
	for k, v := range agent.Env {
		env[k] = v
	}
	env["AGENT_RUN_ID"], env["AGENT_RUN_DIR"], env["AGENT_MODEL"] = r.ID, r.RunDir, req.Model
	timeout := agent.TimeoutSec
	ex, err := s.execs.Exec(ctx, p, rec.ID, sandbox.ExecRequest{Command: agent.Render(req.Model, r.ID, r.RunDir), Env: env,
		Cwd: "/workspace", TimeoutSec: &timeout, Detach: true})
	if err != nil {
		return s.failStart(fail, err, "could not start the agent")
	}
	if err := runs.SetExec(context.WithoutCancel(ctx), r.ID, ex.ExecID, ex.StartedAt); err != nil {
		s.log.Warn("recording an agent run's exec failed", "run", r.ID, "exec", ex.ExecID, "err", err)
	}
	// A cancel that set its flag after the check above saw no exec to kill: the start writes
	// the exec and then reads the flag, the cancel writes the flag and then reads the exec, so
	// one of the two always kills it.
	if cur, err := runs.Get(context.WithoutCancel(ctx), r.ID); err == nil && cur.Cancelled {
		if err := s.execs.CancelExec(context.WithoutCancel(ctx), p, rec.ID, ex.ExecID); err != nil {
			s.log.Warn("killing a run cancelled while it started failed", "run", r.ID, "exec", ex.ExecID, "err", err)
		}
	}
	s.log.Info("agent run started", "run", r.ID, "sandbox", rec.ID, "agent", agent.ID, "exec", ex.ExecID)
	return s.GetAgentRun(context.WithoutCancel(ctx), p, r.ID)
}

// failStart records a start that failed after the run was recorded. Errors of the caller's
// own making (a sandbox that stopped meanwhile, a file too large) are returned as they are,
// with the run FAILED.
func (s *Service) failStart(fail func(string) (sandbox.AgentRun, error), err error, what string) (sandbox.AgentRun, error) {
	_, _ = fail(what + ": " + apierror.From(err).Message)
	return sandbox.AgentRun{}, err
}

func missingBinary(bin string) string {
	return fmt.Sprintf("the agent's binary %q is not in the sandbox's image (command -v %s found nothing): an attached run cannot change a running sandbox's image; use a profile whose image contains it", bin, bin)
}
