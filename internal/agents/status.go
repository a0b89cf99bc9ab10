package agents

import (
	"context"
	"errors"
	"fmt"
	"time"

	"sandboxd/internal/agentrun"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// GetAgentRun returns a run of the caller's project (another project's does not exist).
func (s *Service) GetAgentRun(ctx context.Context, p auth.Principal, runID string) (sandbox.AgentRun, error) {
	r, err := s.loadRun(ctx, p, runID)
	if err != nil {
		return sandbox.AgentRun{}, err
	}
	return s.runView(ctx, p, r), nil
}

func (s *Service) loadRun(ctx context.Context, p auth.Principal, runID string) (agentrun.Record, error) {
	runs, err := s.runStore()
	if err != nil {
		return agentrun.Record{}, err
	}
	if !sandbox.ValidID(runID, runPrefix) {
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
func (s *Service) runView(ctx context.Context, p auth.Principal, r agentrun.Record) sandbox.AgentRun {
	v := sandbox.AgentRun{ID: r.ID, SandboxID: r.Sandbox, AgentID: r.Agent, Model: r.Model, ExecID: r.ExecID, RunDir: r.RunDir,
		CreatedAt: r.CreatedAt, StartedAt: r.StartedAt, EndedAt: r.EndedAt, ExitCode: r.ExitCode, Signal: r.Signal}
	if r.Status != "" {
		v.Status, v.Reason = sandbox.AgentRunStatus(r.Status), r.Reason
		return v
	}
	var ex *sandbox.ExecResult
	gone := false
	if r.ExecID != "" {
		res, err := s.execs.GetExec(ctx, p, r.Sandbox, r.ExecID, false)
		switch {
		case err == nil:
			ex = &res
		case apierror.Is(err, apierror.NotFound):
			gone = true
		default:
			v.Status = sandbox.RunRunning // unknown for now: Redis is away; the exec was started
			return v
		}
	}
	v.Status, v.Reason = runStatus(r.ExecID != "", r.Cancelled, ex, gone, s.now().Sub(r.CreatedAt) > queuedGrace)
	if ex != nil && ex.State == sandbox.ExecEnded {
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
func runStatus(started, cancelled bool, ex *sandbox.ExecResult, gone, stale bool) (sandbox.AgentRunStatus, string) {
	switch {
	case !started && cancelled:
		return sandbox.RunCancelled, "cancelled before the agent started"
	case !started && stale:
		return sandbox.RunFailed, "the agent was never started (the server starting it went away)"
	case !started:
		return sandbox.RunQueued, ""
	case gone:
		return sandbox.RunFailed, "the agent's exec record is gone; its end is unknown"
	case ex.State != sandbox.ExecEnded:
		return sandbox.RunRunning, ""
	case cancelled:
		return sandbox.RunCancelled, "cancelled"
	case ex.TimedOut:
		return sandbox.RunTimedOut, "the agent ran longer than its timeout and was killed"
	case ex.Error != "":
		return sandbox.RunFailed, ex.Error
	case ex.ExitCode == 0 && ex.Signal == "":
		return sandbox.RunSucceeded, ""
	case ex.ExitCode == 127:
		return sandbox.RunFailed, "the agent's command was not found (exit code 127)"
	case ex.Signal != "":
		return sandbox.RunFailed, "the agent was killed by " + ex.Signal
	default:
		return sandbox.RunFailed, fmt.Sprintf("the agent exited with code %d", ex.ExitCode)
	}
}

// ListAgentRuns lists the runs of one of the caller's sandboxes, newest first (at most 100).
func (s *Service) ListAgentRuns(ctx context.Context, p auth.Principal, sandboxID string) ([]sandbox.AgentRun, error) {
	runs, err := s.runStore()
	if err != nil {
		return nil, err
	}
	if sandboxID == "" {
		return nil, apierror.New(apierror.InvalidArgument, "sandbox_id is required").WithDetail("field", "sandbox_id")
	}
	if _, err := s.sandboxes.Load(ctx, p, sandboxID, sandbox.VerbGet); err != nil {
		return nil, err
	}
	recs, err := runs.List(ctx, sandboxID, maxListRuns)
	if err != nil {
		return nil, apierror.Wrap(err, apierror.Unavailable, "could not list agent runs; retry").WithRetryAfter(time.Second)
	}
	out := make([]sandbox.AgentRun, 0, len(recs))
	for _, r := range recs {
		if r.Tenant == p.Tenant && r.Project == p.Project {
			out = append(out, s.runView(ctx, p, r))
		}
	}
	return out, nil
}

// finishRun records a run's final status (the first one recorded stays).
func (s *Service) finishRun(id string, st sandbox.AgentRunStatus, reason string, code int, signal string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.runs.Finish(ctx, id, string(st), reason, code, signal, s.now()); err != nil {
		s.log.Warn("recording an agent run's end failed", "run", id, "err", err)
	}
}
