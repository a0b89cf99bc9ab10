package agents

import (
	"context"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// cancelWait bounds how long a cancel waits for the killed agent's exec to end.
const cancelWait = 10 * time.Second

// CancelAgentRun cancels a run: it is marked cancelled and its exec's whole process tree is
// killed (the process group and every process carrying the exec's id). It answers once the
// agent's exec ended (CANCELLED), or after a bounded wait. A final run is INVALID_STATE.
func (s *Service) CancelAgentRun(ctx context.Context, p auth.Principal, runID string) (sandbox.AgentRun, error) {
	r, err := s.loadRun(ctx, p, runID)
	if err != nil {
		return sandbox.AgentRun{}, err
	}
	if v := s.runView(ctx, p, r); v.Status.Terminal() {
		return v, apierror.New(apierror.InvalidState, "agent run %s is already %s", runID, v.Status).
			WithDetail("status", string(v.Status))
	}
	if err := s.runs.Cancel(ctx, runID); err != nil {
		return sandbox.AgentRun{}, apierror.Wrap(err, apierror.Unavailable, "could not cancel the agent run; retry").WithRetryAfter(time.Second)
	}
	// The exec may have been recorded since r was read (see StartAgentRun).
	if cur, err := s.runs.Get(ctx, runID); err == nil {
		r.ExecID = cur.ExecID
	}
	if r.ExecID != "" {
		if err := s.execs.CancelExec(ctx, p, r.Sandbox, r.ExecID); err != nil {
			return sandbox.AgentRun{}, err
		}
		deadline := time.NewTimer(cancelWait)
		defer deadline.Stop()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
	wait:
		for {
			if ex, err := s.execs.GetExec(ctx, p, r.Sandbox, r.ExecID, false); err != nil || ex.State == sandbox.ExecEnded {
				break
			}
			select {
			case <-tick.C:
			case <-deadline.C:
				break wait
			case <-ctx.Done():
				return sandbox.AgentRun{}, ctx.Err()
			}
		}
	}
	s.log.Info("agent run cancelled", "run", runID, "sandbox", r.Sandbox)
	return s.GetAgentRun(ctx, p, runID)
}
