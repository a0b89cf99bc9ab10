package apitest

import (
	"context"
	"slices"
	"strings"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// agentRun is the fixture run id: opencode in SandboxRunning as the exec ExecRunning, started
// at T0; RunDone SUCCEEDED 5 s later.
func agentRun(id string) sandbox.AgentRun {
	r := sandbox.AgentRun{ID: id, SandboxID: SandboxRunning, AgentID: "opencode", Model: "wandb/moonshotai/Kimi-K2.5",
		Status: sandbox.RunRunning, ExecID: ExecRunning, RunDir: "/workspace/.agent-runs/" + id, CreatedAt: T0, StartedAt: T0}
	if id == RunDone {
		r.Status, r.EndedAt = sandbox.RunSucceeded, T0.Add(5*time.Second)
	}
	return r
}

func (f *Fake) run(id string) (sandbox.AgentRun, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.Runs[id]
	if !ok {
		return sandbox.AgentRun{}, apierror.New(apierror.NotFound, "agent run %s not found", id)
	}
	return r, nil
}

// StartAgentRun answers RunErr; refuses pass_at_k > 1 and sandboxes it does not know;
// else answers Runs[RunRunning].
func (f *Fake) StartAgentRun(_ context.Context, p auth.Principal, req sandbox.AgentRunRequest) (sandbox.AgentRun, error) {
	f.record(Call{Method: "StartAgentRun", Principal: p, SandboxID: req.SandboxID, AgentRun: req})
	f.mu.Lock()
	err := f.RunErr
	f.mu.Unlock()
	if err != nil {
		return sandbox.AgentRun{}, err
	}
	if req.PassAtK > 1 {
		return sandbox.AgentRun{}, apierror.New(apierror.InvalidArgument, "sandbox_id with pass_at_k > 1 is rejected: use Harbor")
	}
	if _, err := lookup(p, req.SandboxID); err != nil {
		return sandbox.AgentRun{}, err
	}
	return f.run(RunRunning)
}

// GetAgentRun answers RunErr, or Runs[runID].
func (f *Fake) GetAgentRun(_ context.Context, p auth.Principal, runID string) (sandbox.AgentRun, error) {
	f.record(Call{Method: "GetAgentRun", Principal: p, ID: runID})
	f.mu.Lock()
	err := f.RunErr
	f.mu.Unlock()
	if err != nil {
		return sandbox.AgentRun{}, err
	}
	return f.run(runID)
}

// ListAgentRuns answers the runs of a known sandbox in the order of their ids (RunDone, then
// RunRunning); a sandbox id is required.
func (f *Fake) ListAgentRuns(_ context.Context, p auth.Principal, sandboxID string) ([]sandbox.AgentRun, error) {
	f.record(Call{Method: "ListAgentRuns", Principal: p, SandboxID: sandboxID})
	if sandboxID == "" {
		return nil, apierror.New(apierror.InvalidArgument, "sandbox_id is required")
	}
	if _, err := lookup(p, sandboxID); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []sandbox.AgentRun
	for _, r := range f.Runs {
		if r.SandboxID == sandboxID {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b sandbox.AgentRun) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// CancelAgentRun cancels a run that is not final yet (in Runs); a final one is INVALID_STATE.
func (f *Fake) CancelAgentRun(_ context.Context, p auth.Principal, runID string) (sandbox.AgentRun, error) {
	f.record(Call{Method: "CancelAgentRun", Principal: p, ID: runID})
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.Runs[runID]
	if !ok {
		return sandbox.AgentRun{}, apierror.New(apierror.NotFound, "agent run %s not found", runID)
	}
	if r.Status.Terminal() {
		return r, apierror.New(apierror.InvalidState, "agent run %s is already %s", runID, r.Status)
	}
	r.Status = sandbox.RunCancelled
	f.Runs[runID] = r
	return r, nil
}

// AgentRunEvents sends RunEvents when set, else the run's status (with the cursor asked for), a chunk
// "hello\n" on stdout, a gap of 7 bytes and the run SUCCEEDED; then it closes.
func (f *Fake) AgentRunEvents(ctx context.Context, p auth.Principal, runID, after string) (<-chan sandbox.AgentRunEvent, error) {
	f.record(Call{Method: "AgentRunEvents", Principal: p, ID: runID, After: after})
	run, err := f.run(runID)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	evs := f.RunEvents
	f.mu.Unlock()
	if evs == nil {
		done := run
		done.Status, done.EndedAt = sandbox.RunSucceeded, T0.Add(5*time.Second)
		evs = []sandbox.AgentRunEvent{
			{Kind: sandbox.AgentRunStatusEvent, Cursor: after, Run: &run},
			{Kind: sandbox.AgentRunChunk, Cursor: "6-0", Stream: "stdout", Data: []byte("hello\n")},
			{Kind: sandbox.AgentRunTruncated, Cursor: "50-0", MissedBytes: 7},
			{Kind: sandbox.AgentRunStatusEvent, Cursor: "50-1", Run: &done},
		}
	}
	ch := make(chan sandbox.AgentRunEvent)
	f.streams.Add(1)
	go func() {
		defer f.streams.Done()
		defer close(ch)
		for _, ev := range evs {
			select {
			case ch <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}
