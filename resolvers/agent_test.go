package resolvers

import (
	"context"
	"encoding/json"
	"testing"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// Agent run ids the fake knows: runRunning is RUNNING in idRunning, runDone SUCCEEDED.
const (
	runRunning = "run_01HZZZZZZZZZZZZZZZZZZZZZZZ"
	runDone    = "run_01HZZZZZZZZZZZZZZZZZZZZZZY"
)

func fakeRun(id string) sandbox.AgentRun {
	r := sandbox.AgentRun{ID: id, SandboxID: idRunning, AgentID: "opencode", Model: "wandb/moonshotai/Kimi-K2.5",
		Status: sandbox.RunRunning, ExecID: execRunning, RunDir: "/workspace/.agent-runs/" + id, CreatedAt: t0, StartedAt: t0}
	if id == runDone {
		r.Status, r.EndedAt = sandbox.RunSucceeded, t0.Add(5e9)
	}
	return r
}

func lookupRun(id string) (sandbox.AgentRun, error) {
	if id != runRunning && id != runDone {
		return sandbox.AgentRun{}, apierror.New(apierror.NotFound, "agent run %s not found", id)
	}
	return fakeRun(id), nil
}

func (f *fakeService) StartAgentRun(_ context.Context, p auth.Principal, req sandbox.AgentRunRequest) (sandbox.AgentRun, error) {
	f.record(p, "StartAgentRun")
	f.mu.Lock()
	f.agentReq = req
	f.mu.Unlock()
	if req.PassAtK > 1 {
		return sandbox.AgentRun{}, apierror.New(apierror.InvalidArgument, "sandbox_id with pass_at_k > 1 is rejected: use Harbor")
	}
	if _, err := lookup(p, req.SandboxID); err != nil {
		return sandbox.AgentRun{}, err
	}
	return fakeRun(runRunning), nil
}

func (f *fakeService) GetAgentRun(_ context.Context, p auth.Principal, id string) (sandbox.AgentRun, error) {
	f.record(p, "GetAgentRun "+id)
	return lookupRun(id)
}

func (f *fakeService) ListAgentRuns(_ context.Context, p auth.Principal, sandboxID string) ([]sandbox.AgentRun, error) {
	f.record(p, "ListAgentRuns "+sandboxID)
	if _, err := lookup(p, sandboxID); err != nil {
		return nil, err
	}
	return []sandbox.AgentRun{fakeRun(runDone), fakeRun(runRunning)}, nil
}

func (f *fakeService) CancelAgentRun(_ context.Context, p auth.Principal, id string) (sandbox.AgentRun, error) {
	f.record(p, "CancelAgentRun "+id)
	r, err := lookupRun(id)
	if err != nil {
		return r, err
	}
	if r.Status.Terminal() {
		return r, apierror.New(apierror.InvalidState, "agent run %s is already %s", id, r.Status)
	}
	r.Status = sandbox.RunCancelled
	return r, nil
}

func (f *fakeService) AgentRunEvents(ctx context.Context, p auth.Principal, id, after string) (<-chan sandbox.AgentRunEvent, error) {
	f.record(p, "AgentRunEvents "+id)
	f.mu.Lock()
	f.agentEventsArg = [2]string{id, after}
	f.mu.Unlock()
	run, err := lookupRun(id)
	if err != nil {
		return nil, err
	}
	done := fakeRun(runDone)
	evs := []sandbox.AgentRunEvent{
		{Kind: sandbox.AgentRunStatusEvent, Cursor: after, Run: &run},
		{Kind: sandbox.AgentRunChunk, Cursor: "6-0", Stream: "stdout", Data: []byte("hello\n")},
		{Kind: sandbox.AgentRunTruncated, Cursor: "50-0", MissedBytes: 7},
		{Kind: sandbox.AgentRunStatusEvent, Cursor: "50-1", Run: &done},
	}
	ch := make(chan sandbox.AgentRunEvent)
	go func() {
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

const startAgentRunMutation = `mutation($in: StartAgentRunInput!) { startAgentRun(input: $in) {
	id sandboxId agentId model status reason execId exitCode runDir createdAt startedAt endedAt } }`

func TestStartAgentRun(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	r := e.post(t, userKey, startAgentRunMutation, map[string]any{"in": map[string]any{
		"agentId": "opencode", "model": "wandb/moonshotai/Kimi-K2.5", "sandboxId": idRunning,
		"instruction": "Continue from the current files and fix the next failure", "config": map[string]any{"a": 1}}})
	noErrors(t, r)
	var got struct {
		ID, SandboxID, Status, RunDir string
		ExitCode                      *int
		ExecID                        *string
	}
	field(t, r, "startAgentRun", &got)
	if got.ID != runRunning || got.SandboxID != idRunning || got.Status != "RUNNING" || got.ExitCode != nil ||
		got.ExecID == nil || *got.ExecID != execRunning {
		t.Errorf("got %+v, want the RUNNING run", got)
	}
	req := e.fake.agentReq
	if req.AgentID != "opencode" || req.Model != "wandb/moonshotai/Kimi-K2.5" || req.SandboxID != idRunning ||
		req.PassAtK != 0 || string(req.Config) != `{"a":1}` {
		t.Errorf("got request %+v (config %s), want the input", req, req.Config)
	}
	for _, tc := range []struct {
		name string
		in   map[string]any
		code string
	}{
		{"pass-at-k", map[string]any{"agentId": "opencode", "instruction": "x", "sandboxId": idRunning, "passAtK": 2}, "INVALID_ARGUMENT"},
		{"pass-at-k-zero", map[string]any{"agentId": "opencode", "instruction": "x", "sandboxId": idRunning, "passAtK": 0}, "INVALID_ARGUMENT"},
		{"not-running", map[string]any{"agentId": "opencode", "instruction": "x", "sandboxId": idBusy}, "INVALID_STATE"},
		{"other-tenant", map[string]any{"agentId": "opencode", "instruction": "x", "sandboxId": "sbx_other"}, "NOT_FOUND"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.post(t, userKey, startAgentRunMutation, map[string]any{"in": tc.in})
			if got := r.code(0); got != tc.code {
				t.Fatalf("got %q (%+v), want %s", got, r.Errors, tc.code)
			}
		})
	}
}

func TestAgentRunQueriesAndCancel(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	r := e.post(t, userKey, `{ agentRun(id: "`+runDone+`") { id status exitCode endedAt } }`, nil)
	noErrors(t, r)
	var one struct {
		ID, Status string
		ExitCode   *int
		EndedAt    *string
	}
	field(t, r, "agentRun", &one)
	if one.ID != runDone || one.Status != "SUCCEEDED" || one.ExitCode == nil || *one.ExitCode != 0 || one.EndedAt == nil {
		t.Errorf("agentRun: got %+v, want SUCCEEDED with exit code 0", one)
	}
	r = e.post(t, userKey, `{ agentRun(id: "run_other") { id } }`, nil)
	if r.code(0) != "NOT_FOUND" || string(r.Data["agentRun"]) != "null" {
		t.Errorf("unknown run: got %q %s, want NOT_FOUND and null", r.code(0), r.Data["agentRun"])
	}
	r = e.post(t, userKey, `{ agentRuns(sandboxId: "`+idRunning+`") { id status } }`, nil)
	noErrors(t, r)
	var list []struct{ ID, Status string }
	field(t, r, "agentRuns", &list)
	if len(list) != 2 || list[0].ID != runDone || list[1].Status != "RUNNING" {
		t.Errorf("agentRuns: got %+v, want both runs newest first", list)
	}
	r = e.post(t, userKey, `mutation { cancelAgentRun(id: "`+runRunning+`") { id status } }`, nil)
	noErrors(t, r)
	var c struct{ ID, Status string }
	field(t, r, "cancelAgentRun", &c)
	if c.Status != "CANCELLED" {
		t.Errorf("cancel: got %+v, want CANCELLED", c)
	}
	r = e.post(t, userKey, `mutation { cancelAgentRun(id: "`+runDone+`") { id } }`, nil)
	if r.code(0) != "INVALID_STATE" {
		t.Errorf("cancel of a final run: got %q, want INVALID_STATE", r.code(0))
	}
}

func TestAgentRunEventsSSE(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	_, sc := postSSEVars(t, e, userKey, `subscription($id: ID!, $a: String) { agentRunEvents(runId: $id, after: $a) {
		cursor kind run { id status } stream data dataBase64 missedBytes } }`, map[string]any{"id": runRunning, "a": "3-0"})
	var kinds []string
	var last struct {
		Data struct {
			AgentRunEvents struct {
				Kind string
				Run  *struct{ Status string }
			}
		}
	}
	for _, data := range readSSE(t, sc) {
		var ev struct {
			Data struct {
				AgentRunEvents struct {
					Kind   string
					Data   *string
					Stream *string
				}
			}
		}
		if err := json.Unmarshal(data, &ev); err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, ev.Data.AgentRunEvents.Kind)
		if err := json.Unmarshal(data, &last); err != nil {
			t.Fatal(err)
		}
		if ev.Data.AgentRunEvents.Kind == "CHUNK" && (ev.Data.AgentRunEvents.Data == nil || *ev.Data.AgentRunEvents.Data != "hello\n" ||
			ev.Data.AgentRunEvents.Stream == nil || *ev.Data.AgentRunEvents.Stream != "STDOUT") {
			t.Errorf("chunk: got %s", data)
		}
	}
	if len(kinds) != 4 || kinds[0] != "STATUS" || kinds[1] != "CHUNK" || kinds[2] != "TRUNCATED" || kinds[3] != "STATUS" ||
		last.Data.AgentRunEvents.Run == nil || last.Data.AgentRunEvents.Run.Status != "SUCCEEDED" {
		t.Errorf("events: got %v (last %+v), want STATUS CHUNK TRUNCATED STATUS(SUCCEEDED)", kinds, last)
	}
	if e.fake.agentEventsArg != [2]string{runRunning, "3-0"} {
		t.Errorf("got AgentRunEvents%v, want [%s 3-0]", e.fake.agentEventsArg, runRunning)
	}
}
