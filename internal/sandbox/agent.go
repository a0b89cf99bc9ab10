package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/oklog/ulid/v2"

	"sandboxd/internal/agentrun"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
)

// Agent runs attach a catalog agent (a coding agent CLI already in the sandbox's image) to a
// running sandbox: the instruction and config are uploaded into a folder of the workspace
// (/workspace/.agent-runs/<run id>/), the agent's command line runs there as a detached exec,
// and the sandbox stays alive afterwards. The run's status is derived from that exec (and a
// cancelled flag) and stored once final (internal/agentrun).

// AgentConfig is one catalog agent.
type AgentConfig struct {
	ID          string `json:"id"`
	Description string `json:"description,omitempty"`
	// Integrations are the ways the agent may run: IntegrationSandbox (attach to a running
	// sandbox: the only kind this service starts) and others, e.g. "harbor" (graded,
	// independent attempts, run elsewhere).
	Integrations []string `json:"integrations"`
	// Binary is the command the sandbox's image must contain (checked with `command -v`).
	Binary string `json:"binary"`
	// Command is the argv template. Placeholders, replaced inside each argument:
	// {{model}}, {{instruction_file}}, {{config_file}}, {{run_dir}}, {{run_id}}.
	Command []string `json:"command"`
	// TimeoutSec bounds a run (default: the exec timeout default).
	TimeoutSec int64             `json:"timeout_sec,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
}

// IntegrationSandbox is the integration kind of agents that may attach to a running sandbox.
const IntegrationSandbox = "sandbox"

// AgentRunsDir is the workspace folder that holds one folder per run.
const AgentRunsDir = "/workspace/.agent-runs"

var (
	placeholder = regexp.MustCompile(`\{\{[^}]*\}\}`)
	agentIDRe   = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	knownHolder = map[string]bool{"{{model}}": true, "{{instruction_file}}": true, "{{config_file}}": true,
		"{{run_dir}}": true, "{{run_id}}": true}
)

func validateAgents(agents []AgentConfig, l *Limits) error {
	seen := map[string]bool{}
	for i := range agents {
		a := &agents[i]
		if !agentIDRe.MatchString(a.ID) {
			return fmt.Errorf("sandbox config: agent %q: id must match %s", a.ID, agentIDRe)
		}
		if seen[a.ID] {
			return fmt.Errorf("sandbox config: agent %q twice", a.ID)
		}
		seen[a.ID] = true
		if len(a.Integrations) == 0 {
			return fmt.Errorf("sandbox config: agent %q has no integrations", a.ID)
		}
		if a.Binary == "" || strings.ContainsAny(a.Binary, " \t\n'\"\\$`") {
			return fmt.Errorf("sandbox config: agent %q: binary must be a command name or path without spaces or quotes", a.ID)
		}
		if len(a.Command) == 0 {
			return fmt.Errorf("sandbox config: agent %q has no command", a.ID)
		}
		for _, arg := range a.Command {
			for _, h := range placeholder.FindAllString(arg, -1) {
				if !knownHolder[h] {
					return fmt.Errorf("sandbox config: agent %q: unknown placeholder %s (known: {{model}}, {{instruction_file}}, {{config_file}}, {{run_dir}}, {{run_id}})", a.ID, h)
				}
			}
		}
		for k := range a.Env {
			if k == "" || strings.HasPrefix(k, "SBX_") || strings.ContainsAny(k, "=\x00") {
				return fmt.Errorf("sandbox config: agent %q: env name %q is not allowed", a.ID, k)
			}
		}
		if a.TimeoutSec == 0 {
			a.TimeoutSec = l.ExecTimeoutDefaultSec
		}
		if a.TimeoutSec < 0 || a.TimeoutSec > l.ExecTimeoutMaxSec {
			return fmt.Errorf("sandbox config: agent %q: timeout_sec must be in 1..%d", a.ID, l.ExecTimeoutMaxSec)
		}
	}
	return nil
}

func (a AgentConfig) usesModel() bool {
	return slices.ContainsFunc(a.Command, func(s string) bool { return strings.Contains(s, "{{model}}") })
}

// render fills the command template.
func (a AgentConfig) render(model, runID, runDir string) []string {
	r := strings.NewReplacer("{{model}}", model, "{{instruction_file}}", runDir+"/instruction.md",
		"{{config_file}}", runDir+"/config.json", "{{run_dir}}", runDir, "{{run_id}}", runID)
	out := make([]string, len(a.Command))
	for i, s := range a.Command {
		out[i] = r.Replace(s)
	}
	return out
}

// AgentRunStatus is where an agent run is.
type AgentRunStatus string

// The agent run statuses. QUEUED → RUNNING → SUCCEEDED | FAILED | CANCELLED | TIMED_OUT (a run
// may also go from QUEUED to FAILED or CANCELLED directly).
const (
	RunQueued    AgentRunStatus = "QUEUED"
	RunRunning   AgentRunStatus = "RUNNING"
	RunSucceeded AgentRunStatus = "SUCCEEDED"
	RunFailed    AgentRunStatus = "FAILED"
	RunCancelled AgentRunStatus = "CANCELLED"
	RunTimedOut  AgentRunStatus = "TIMED_OUT"
)

// Terminal reports whether the status is final.
func (s AgentRunStatus) Terminal() bool {
	return s == RunSucceeded || s == RunFailed || s == RunCancelled || s == RunTimedOut
}

// AgentRunRequest starts an agent run.
type AgentRunRequest struct {
	AgentID     string
	Model       string
	Instruction string
	SandboxID   string
	// PassAtK is the number of independent attempts (0 or 1: one). More is refused with a
	// sandbox: graded attempts do not attach to one.
	PassAtK int
	// Config is the agent's config: a JSON object, or empty.
	Config json.RawMessage
}

// AgentRun is what clients see of one agent run.
type AgentRun struct {
	ID        string
	SandboxID string
	AgentID   string
	Model     string
	Status    AgentRunStatus
	// Reason says why a run FAILED (or how it ended otherwise), "" when there is nothing to say.
	Reason string
	// ExecID is the exec the agent runs as ("" when it never started); its output is the run's.
	ExecID string
	// ExitCode and Signal are the agent's exit, meaningful once the run is final and ran.
	ExitCode int
	Signal   string
	// RunDir is the run's folder in the workspace: instruction.md and config.json.
	RunDir    string
	CreatedAt time.Time
	StartedAt time.Time
	EndedAt   time.Time
}

// AgentRunEventKind says what an AgentRunEvent carries.
type AgentRunEventKind string

// The agent run event kinds.
const (
	// AgentRunStatusEvent carries the run's status (Run): the first event, and the last once
	// the run is final.
	AgentRunStatusEvent AgentRunEventKind = "STATUS"
	// AgentRunChunk carries agent output (Stream, Data).
	AgentRunChunk AgentRunEventKind = "CHUNK"
	// AgentRunTruncated says output before Cursor was dropped (MissedBytes).
	AgentRunTruncated AgentRunEventKind = "TRUNCATED"
)

// AgentRunEvent is one event of a run's stream.
type AgentRunEvent struct {
	Kind AgentRunEventKind
	// Cursor is the position in the run's output after this event: pass it back as `after`.
	Cursor      string
	Run         *AgentRun
	Stream      string
	Data        []byte
	MissedBytes int64
}

// queuedGrace is how long a run may stay QUEUED before it counts as abandoned (the replica
// starting it went away between upload and start).
const queuedGrace = 2 * time.Minute

const (
	runPrefix      = "run_"
	maxModelBytes  = 256
	maxListRuns    = 100
	binaryCheckSec = 30
)

func validRunID(id string) bool {
	if len(id) != len(runPrefix)+26 || !strings.HasPrefix(id, runPrefix) {
		return false
	}
	_, err := ulid.ParseStrict(id[len(runPrefix):])
	return err == nil
}

func runNotFound(id string) error {
	return apierror.New(apierror.NotFound, "agent run %s not found", apierror.Truncate(id, 64))
}

func (s *Service) runStore() (*agentrun.Store, error) {
	if s.runs == nil {
		return nil, apierror.New(apierror.Unavailable, "agent runs are not configured on this server")
	}
	return s.runs, nil
}

// Agents lists the catalog.
func (s *Service) Agents() []AgentConfig { return slices.Clone(s.cfg.Agents) }

// validateAgentRun checks a start request against the product's rules, before anything is
// looked up or written.
func (s *Service) validateAgentRun(req AgentRunRequest) (AgentConfig, error) {
	bad := func(field, format string, args ...any) error {
		return apierror.New(apierror.InvalidArgument, format, args...).WithDetail("field", field)
	}
	if req.PassAtK < 0 {
		return AgentConfig{}, bad("pass_at_k", "pass_at_k must be at least 1, got %d", req.PassAtK)
	}
	if req.SandboxID != "" && req.PassAtK > 1 {
		return AgentConfig{}, bad("pass_at_k", "sandbox_id with pass_at_k > 1 is rejected: independent, graded attempts do not attach to a sandbox; use Harbor for them")
	}
	if req.SandboxID == "" {
		return AgentConfig{}, bad("sandbox_id", "sandbox_id is required: an agent run attaches to a running sandbox (use Harbor for independent, graded attempts)")
	}
	if req.AgentID == "" {
		return AgentConfig{}, bad("agent_id", "agent_id is required")
	}
	a, ok := s.agents[req.AgentID]
	if !ok {
		ids := make([]string, 0, len(s.cfg.Agents))
		for _, a := range s.cfg.Agents {
			ids = append(ids, a.ID)
		}
		return AgentConfig{}, bad("agent_id", "unknown agent %q (the catalog has: %s)", apierror.Truncate(req.AgentID, 64), strings.Join(ids, ", "))
	}
	if !slices.Contains(a.Integrations, IntegrationSandbox) {
		return AgentConfig{}, bad("agent_id", "agent %q has integrations [%s]: only catalog agents with integration: sandbox attach to a running sandbox",
			a.ID, strings.Join(a.Integrations, ", "))
	}
	if len(req.Model) > maxModelBytes || strings.ContainsFunc(req.Model, unicode.IsControl) {
		return AgentConfig{}, bad("model", "model must be at most %d bytes without control characters", maxModelBytes)
	}
	if req.Model == "" && a.usesModel() {
		return AgentConfig{}, bad("model", "model is required by agent %q", a.ID)
	}
	if strings.TrimSpace(req.Instruction) == "" {
		return AgentConfig{}, bad("instruction", "instruction is required")
	}
	if l := s.cfg.Limits.AgentMaxInstructionBytes; len(req.Instruction) > l {
		return AgentConfig{}, apierror.New(apierror.PayloadTooLarge, "instruction is %d bytes, at most %d", len(req.Instruction), l).
			WithDetail("field", "instruction")
	}
	if len(bytes.TrimSpace(req.Config)) > 0 {
		if l := s.cfg.Limits.AgentMaxConfigBytes; len(req.Config) > l {
			return AgentConfig{}, apierror.New(apierror.PayloadTooLarge, "config is %d bytes, at most %d", len(req.Config), l).
				WithDetail("field", "config")
		}
		var obj map[string]any
		if err := json.Unmarshal(req.Config, &obj); err != nil || obj == nil {
			return AgentConfig{}, bad("config", "config must be a JSON object")
		}
	}
	return a, nil
}

// StartAgentRun starts a catalog agent inside the caller's running sandbox: it uploads the
// instruction and config into /workspace/.agent-runs/<run id>/, checks that the agent's
// binary is in the image (a run without it is FAILED at once, with that reason) and starts the
// agent as a detached exec. It answers with the run (RUNNING, or FAILED); the agent runs on
// after the request, and the sandbox stays alive afterwards.
func (s *Service) StartAgentRun(ctx context.Context, p auth.Principal, req AgentRunRequest) (AgentRun, error) {
	runs, err := s.runStore()
	if err != nil {
		return AgentRun{}, err
	}
	agent, err := s.validateAgentRun(req)
	if err != nil {
		return AgentRun{}, err
	}
	rec, err := s.load(ctx, p, req.SandboxID, VerbExec)
	if err != nil {
		return AgentRun{}, err
	}
	id := newID(runPrefix)
	r := agentrun.Record{ID: id, Tenant: rec.Tenant, Project: rec.Project, Sandbox: rec.ID, Agent: agent.ID,
		Model: req.Model, RunDir: AgentRunsDir + "/" + id, CreatedAt: s.now().UTC()}
	if err := runs.Create(ctx, r); err != nil {
		return AgentRun{}, apierror.Wrap(err, apierror.Unavailable, "could not record the agent run; retry").WithRetryAfter(time.Second)
	}
	// From here on the run exists: whatever fails makes it FAILED with the reason.
	fail := func(reason string) (AgentRun, error) {
		s.finishRun(r.ID, RunFailed, reason, -1, "")
		return s.GetAgentRun(context.WithoutCancel(ctx), p, r.ID)
	}
	cfg := req.Config
	if len(bytes.TrimSpace(cfg)) == 0 {
		cfg = json.RawMessage("{}")
	}
	if _, err := s.WriteFile(ctx, p, rec.ID, r.RunDir+"/instruction.md", 0o644, strings.NewReader(req.Instruction)); err != nil {
		return s.failStart(fail, err, "could not upload the instruction")
	}
	if _, err := s.WriteFile(ctx, p, rec.ID, r.RunDir+"/config.json", 0o644, bytes.NewReader(cfg)); err != nil {
		return s.failStart(fail, err, "could not upload the config")
	}
	check := int64(binaryCheckSec)
	res, err := s.Exec(ctx, p, rec.ID, ExecRequest{Command: []string{"sh", "-c", `command -v -- "$1" >/dev/null 2>&1`, "sh", agent.Binary},
		TimeoutSec: &check})
	if err != nil {
		return s.failStart(fail, err, "could not check for the agent's binary")
	}
	if res.ExitCode != 0 || res.Error != "" {
		return fail(missingBinary(agent.Binary))
	}
	if cur, err := runs.Get(ctx, r.ID); err == nil && cur.Cancelled {
		s.finishRun(r.ID, RunCancelled, "cancelled before the agent started", -1, "")
		return s.GetAgentRun(ctx, p, r.ID)
	}
	env := map[string]string{}
	for k, v := range agent.Env {
		env[k] = v
	}
	env["AGENT_RUN_ID"], env["AGENT_RUN_DIR"], env["AGENT_MODEL"] = r.ID, r.RunDir, req.Model
	timeout := agent.TimeoutSec
	ex, err := s.Exec(ctx, p, rec.ID, ExecRequest{Command: agent.render(req.Model, r.ID, r.RunDir), Env: env,
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
		if err := s.CancelExec(context.WithoutCancel(ctx), p, rec.ID, ex.ExecID); err != nil {
			s.log.Warn("killing a run cancelled while it started failed", "run", r.ID, "exec", ex.ExecID, "err", err)
		}
	}
	s.log.Info("agent run started", "run", r.ID, "sandbox", rec.ID, "agent", agent.ID, "exec", ex.ExecID)
	return s.GetAgentRun(context.WithoutCancel(ctx), p, r.ID)
}

// failStart records a start that failed after the run was recorded. Errors of the caller's
// own making (a sandbox that stopped meanwhile, a file too large) are returned as they are,
// with the run FAILED.
func (s *Service) failStart(fail func(string) (AgentRun, error), err error, what string) (AgentRun, error) {
	_, _ = fail(what + ": " + apierror.From(err).Message)
	return AgentRun{}, err
}

func missingBinary(bin string) string {
	return fmt.Sprintf("the agent's binary %q is not in the sandbox's image (command -v %s found nothing): an attached run cannot change a running sandbox's image; use a profile whose image contains it", bin, bin)
}

// finishRun records a run's final status (the first one recorded stays).
func (s *Service) finishRun(id string, st AgentRunStatus, reason string, code int, signal string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.bg), 5*time.Second)
	defer cancel()
	if err := s.runs.Finish(ctx, id, string(st), reason, code, signal, s.now()); err != nil {
		s.log.Warn("recording an agent run's end failed", "run", id, "err", err)
	}
}

// GetAgentRun returns a run of the caller's project (another project's does not exist).
func (s *Service) GetAgentRun(ctx context.Context, p auth.Principal, runID string) (AgentRun, error) {
	r, err := s.loadRun(ctx, p, runID)
	if err != nil {
		return AgentRun{}, err
	}
	return s.runView(ctx, p, r), nil
}

func (s *Service) loadRun(ctx context.Context, p auth.Principal, runID string) (agentrun.Record, error) {
	runs, err := s.runStore()
	if err != nil {
		return agentrun.Record{}, err
	}
	if !validRunID(runID) {
		return agentrun.Record{}, runNotFound(runID)
	}
	r, err := runs.Get(ctx, runID)
	if errors.Is(err, agentrun.ErrNotFound) {
		return agentrun.Record{}, runNotFound(runID)
	}
	if err != nil {
		return agentrun.Record{}, apierror.Wrap(err, apierror.Unavailable, "could not read the agent run; retry").WithRetryAfter(time.Second)
	}
	if r.Tenant != p.Tenant || r.Project != p.Project {
		return agentrun.Record{}, runNotFound(runID)
	}
	return r, nil
}

// runView derives a run's status from its record and its exec, and stores it once final.
func (s *Service) runView(ctx context.Context, p auth.Principal, r agentrun.Record) AgentRun {
	v := AgentRun{ID: r.ID, SandboxID: r.Sandbox, AgentID: r.Agent, Model: r.Model, ExecID: r.ExecID, RunDir: r.RunDir,
		CreatedAt: r.CreatedAt, StartedAt: r.StartedAt, EndedAt: r.EndedAt, ExitCode: r.ExitCode, Signal: r.Signal}
	if r.Status != "" {
		v.Status, v.Reason = AgentRunStatus(r.Status), r.Reason
		return v
	}
	var ex *ExecResult
	gone := false
	if r.ExecID != "" {
		res, err := s.GetExec(ctx, p, r.Sandbox, r.ExecID, false)
		switch {
		case err == nil:
			ex = &res
		case apierror.Is(err, apierror.NotFound):
			gone = true
		default:
			v.Status = RunRunning // unknown for now: Redis is away; the exec was started
			return v
		}
	}
	v.Status, v.Reason = runStatus(r.ExecID != "", r.Cancelled, ex, gone, s.now().Sub(r.CreatedAt) > queuedGrace)
	if ex != nil && ex.State == ExecEnded {
		v.ExitCode, v.Signal, v.EndedAt = ex.ExitCode, ex.Signal, ex.EndedAt
	}
	if v.Status.Terminal() {
		if v.EndedAt.IsZero() {
			v.EndedAt = s.now().UTC()
		}
		s.finishRun(r.ID, v.Status, v.Reason, v.ExitCode, v.Signal)
	}
	return v
}

// runStatus is the run's status as a pure function of what is known: whether the agent's
// exec was started, the cancelled flag, the exec's status (nil when not started or gone),
// whether the exec's record is gone, and whether a never-started run is older than the grace.
func runStatus(started, cancelled bool, ex *ExecResult, gone, stale bool) (AgentRunStatus, string) {
	switch {
	case !started && cancelled:
		return RunCancelled, "cancelled before the agent started"
	case !started && stale:
		return RunFailed, "the agent was never started (the server starting it went away)"
	case !started:
		return RunQueued, ""
	case gone:
		return RunFailed, "the agent's exec record is gone; its end is unknown"
	case ex.State != ExecEnded:
		return RunRunning, ""
	case cancelled:
		return RunCancelled, "cancelled"
	case ex.TimedOut:
		return RunTimedOut, "the agent ran longer than its timeout and was killed"
	case ex.Error != "":
		return RunFailed, ex.Error
	case ex.ExitCode == 0 && ex.Signal == "":
		return RunSucceeded, ""
	case ex.ExitCode == 127:
		return RunFailed, "the agent's command was not found (exit code 127)"
	case ex.Signal != "":
		return RunFailed, "the agent was killed by " + ex.Signal
	default:
		return RunFailed, fmt.Sprintf("the agent exited with code %d", ex.ExitCode)
	}
}

// ListAgentRuns lists the runs of one of the caller's sandboxes, newest first (at most 100).
func (s *Service) ListAgentRuns(ctx context.Context, p auth.Principal, sandboxID string) ([]AgentRun, error) {
	runs, err := s.runStore()
	if err != nil {
		return nil, err
	}
	if sandboxID == "" {
		return nil, apierror.New(apierror.InvalidArgument, "sandbox_id is required").WithDetail("field", "sandbox_id")
	}
	if _, err := s.load(ctx, p, sandboxID, VerbGet); err != nil {
		return nil, err
	}
	recs, err := runs.List(ctx, sandboxID, maxListRuns)
	if err != nil {
		return nil, apierror.Wrap(err, apierror.Unavailable, "could not list agent runs; retry").WithRetryAfter(time.Second)
	}
	out := make([]AgentRun, 0, len(recs))
	for _, r := range recs {
		if r.Tenant == p.Tenant && r.Project == p.Project {
			out = append(out, s.runView(ctx, p, r))
		}
	}
	return out, nil
}

// cancelWait bounds how long a cancel waits for the killed agent's exec to end.
const cancelWait = 10 * time.Second

// CancelAgentRun cancels a run: it is marked cancelled and its exec's whole process tree is
// killed (the process group and every process carrying the exec's id). It answers once the
// agent's exec ended (CANCELLED), or after a bounded wait. A final run is INVALID_STATE.
func (s *Service) CancelAgentRun(ctx context.Context, p auth.Principal, runID string) (AgentRun, error) {
	r, err := s.loadRun(ctx, p, runID)
	if err != nil {
		return AgentRun{}, err
	}
	if v := s.runView(ctx, p, r); v.Status.Terminal() {
		return v, apierror.New(apierror.InvalidState, "agent run %s is already %s", runID, v.Status).
			WithDetail("status", string(v.Status))
	}
	if err := s.runs.Cancel(ctx, runID); err != nil {
		return AgentRun{}, apierror.Wrap(err, apierror.Unavailable, "could not cancel the agent run; retry").WithRetryAfter(time.Second)
	}
	// The exec may have been recorded since r was read (see StartAgentRun).
	if cur, err := s.runs.Get(ctx, runID); err == nil {
		r.ExecID = cur.ExecID
	}
	if r.ExecID != "" {
		if err := s.CancelExec(ctx, p, r.Sandbox, r.ExecID); err != nil {
			return AgentRun{}, err
		}
		deadline := time.NewTimer(cancelWait)
		defer deadline.Stop()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
	wait:
		for {
			if ex, err := s.GetExec(ctx, p, r.Sandbox, r.ExecID, false); err != nil || ex.State == ExecEnded {
				break
			}
			select {
			case <-tick.C:
			case <-deadline.C:
				break wait
			case <-ctx.Done():
				return AgentRun{}, ctx.Err()
			}
		}
	}
	s.log.Info("agent run cancelled", "run", runID, "sandbox", r.Sandbox)
	return s.GetAgentRun(ctx, p, runID)
}

// CancelExec kills a running exec of the caller's sandbox with every process it started (the
// guest init finds them in the exec's cgroup, or by process group and parentage where it has
// none). An exec that ended already is left as it is.
func (s *Service) CancelExec(ctx context.Context, p auth.Principal, sandboxID, execID string) error {
	m, err := s.loadExec(ctx, p, sandboxID, execID)
	if err != nil {
		return err
	}
	if _, err := s.load(ctx, p, m.Sandbox, VerbExec); err != nil {
		return err
	}
	g, err := s.guest(ctx, m.Sandbox)
	if err != nil {
		return err
	}
	if err := g.Signal(ctx, execID, "SIGKILL"); err != nil {
		return s.guestError(ctx, m.Sandbox, err)
	}
	return nil
}

// AgentRunEvents streams a run: its status first, then the agent's output after the cursor
// after ("" = from the start), and its final status last, after which the channel closes. It
// also closes when ctx ends.
func (s *Service) AgentRunEvents(ctx context.Context, p auth.Principal, runID, after string) (<-chan AgentRunEvent, error) {
	r, err := s.loadRun(ctx, p, runID)
	if err != nil {
		return nil, err
	}
	first := s.runView(ctx, p, r)
	var in <-chan ExecEvent
	if first.ExecID != "" {
		in, err = s.ExecOutput(ctx, p, first.ExecID, after)
		if err != nil && !apierror.Is(err, apierror.NotFound) {
			return nil, err
		}
	}
	out := make(chan AgentRunEvent)
	go func() {
		defer close(out)
		send := func(ev AgentRunEvent) bool {
			select {
			case out <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		if !send(AgentRunEvent{Kind: AgentRunStatusEvent, Cursor: after, Run: &first}) {
			return
		}
		cursor := after
		if in == nil {
			return // never ran, or its exec is gone: the status said it all
		}
		for ev := range in {
			cursor = ev.Cursor
			var e AgentRunEvent
			switch ev.Kind {
			case ExecChunk:
				e = AgentRunEvent{Kind: AgentRunChunk, Cursor: ev.Cursor, Stream: ev.Stream, Data: ev.Data}
			case ExecTruncated:
				e = AgentRunEvent{Kind: AgentRunTruncated, Cursor: ev.Cursor, MissedBytes: ev.MissedBytes}
			default:
				continue
			}
			if !send(e) {
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		last, err := s.GetAgentRun(ctx, p, runID)
		if err != nil || first.Status.Terminal() && last.Status == first.Status {
			return
		}
		send(AgentRunEvent{Kind: AgentRunStatusEvent, Cursor: cursor, Run: &last})
	}()
	return out, nil
}
