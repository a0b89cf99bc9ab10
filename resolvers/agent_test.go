package resolvers

import (
	"encoding/json"
	"testing"

	"sandboxd/internal/api/apitest"
)

const startAgentRunMutation = `mutation($in: StartAgentRunInput!) { startAgentRun(input: $in) { agentRun {
	id sandboxId agentId model status reason execId exitCode runDir createdAt startedAt endedAt } } }`

func TestStartAgentRun(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	r := e.post(t, apitest.UserKey, startAgentRunMutation, map[string]any{"in": map[string]any{
		"agentId": "opencode", "model": "wandb/moonshotai/Kimi-K2.5", "sandboxId": apitest.SandboxRunning,
		"instruction": "Continue from the current files and fix the next failure", "config": map[string]any{"a": 1}}})
	noErrors(t, r)
	var got struct {
		ID, SandboxID, Status, RunDir string
		ExitCode                      *int
		ExecID                        *string
	}
	field(t, r, "startAgentRun.agentRun", &got)
	if got.ID != apitest.RunRunning || got.SandboxID != apitest.SandboxRunning || got.Status != "RUNNING" || got.ExitCode != nil ||
		got.ExecID == nil || *got.ExecID != apitest.ExecRunning {
		t.Errorf("got %+v, want the RUNNING run", got)
	}
	req := e.fake.Last("StartAgentRun").AgentRun
	if req.AgentID != "opencode" || req.Model != "wandb/moonshotai/Kimi-K2.5" || req.SandboxID != apitest.SandboxRunning ||
		req.PassAtK != 0 || string(req.Config) != `{"a":1}` {
		t.Errorf("got request %+v (config %s), want the input", req, req.Config)
	}
	for _, tc := range []struct {
		name string
		in   map[string]any
		code string
	}{
		{"pass-at-k", map[string]any{"agentId": "opencode", "instruction": "x", "sandboxId": apitest.SandboxRunning, "passAtK": 2}, "INVALID_ARGUMENT"},
		{"pass-at-k-zero", map[string]any{"agentId": "opencode", "instruction": "x", "sandboxId": apitest.SandboxRunning, "passAtK": 0}, "INVALID_ARGUMENT"},
		{"not-running", map[string]any{"agentId": "opencode", "instruction": "x", "sandboxId": apitest.SandboxBusy}, "INVALID_STATE"},
		{"other-tenant", map[string]any{"agentId": "opencode", "instruction": "x", "sandboxId": "sbx_other"}, "NOT_FOUND"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.post(t, apitest.UserKey, startAgentRunMutation, map[string]any{"in": tc.in})
			if got := r.code(0); got != tc.code {
				t.Fatalf("got %q (%+v), want %s", got, r.Errors, tc.code)
			}
		})
	}
}

func TestAgentRunQueriesAndCancel(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	r := e.post(t, apitest.UserKey, `{ agentRun(id: "`+apitest.RunDone+`") { id status exitCode endedAt } }`, nil)
	noErrors(t, r)
	var one struct {
		ID, Status string
		ExitCode   *int
		EndedAt    *string
	}
	field(t, r, "agentRun", &one)
	if one.ID != apitest.RunDone || one.Status != "SUCCEEDED" || one.ExitCode == nil || *one.ExitCode != 0 || one.EndedAt == nil {
		t.Errorf("agentRun: got %+v, want SUCCEEDED with exit code 0", one)
	}
	r = e.post(t, apitest.UserKey, `{ agentRun(id: "run_other") { id } }`, nil)
	if r.code(0) != "NOT_FOUND" || string(r.Data["agentRun"]) != "null" {
		t.Errorf("unknown run: got %q %s, want NOT_FOUND and null", r.code(0), r.Data["agentRun"])
	}
	r = e.post(t, apitest.UserKey, `{ agentRuns(sandboxId: "`+apitest.SandboxRunning+`") { nodes { id status } } }`, nil)
	noErrors(t, r)
	var runs struct{ Nodes []struct{ ID, Status string } }
	field(t, r, "agentRuns", &runs)
	list := runs.Nodes
	if len(list) != 2 || list[0].ID != apitest.RunDone || list[1].Status != "RUNNING" {
		t.Errorf("agentRuns: got %+v, want both runs newest first", list)
	}
	q := `query($s: ID!, $first: Int, $after: String) { agentRuns(sandboxId: $s, first: $first, after: $after) { ` + pageSelection + ` } }`
	checkPages(t, e, q, "agentRuns", map[string]any{"s": apitest.SandboxRunning, "first": 1}, []string{apitest.RunDone, apitest.RunRunning})
	if a := e.fake.Last("AgentRunPage"); a.Limit != 1 || a.After != apitest.RunDone || a.SandboxID != apitest.SandboxRunning {
		t.Errorf("the service got %+v, want a page of 1 after %s", a, apitest.RunDone)
	}
	for _, vars := range []map[string]any{{"s": apitest.SandboxRunning, "first": apitest.MaxPage + 1}, {"s": apitest.SandboxRunning, "after": "run_nope"}} {
		if r := e.post(t, apitest.UserKey, q, vars); r.code(0) != "INVALID_ARGUMENT" {
			t.Errorf("%v: got %+v, want INVALID_ARGUMENT", vars, r.Errors)
		}
	}
	if r := e.post(t, apitest.UserKey, q, map[string]any{"s": "sbx_other"}); r.code(0) != "NOT_FOUND" {
		t.Errorf("another tenant's sandbox: got %+v, want NOT_FOUND", r.Errors)
	}
	r = e.post(t, apitest.UserKey, `mutation { cancelAgentRun(id: "`+apitest.RunRunning+`") { agentRun { id status } } }`, nil)
	noErrors(t, r)
	var c struct{ ID, Status string }
	field(t, r, "cancelAgentRun.agentRun", &c)
	if c.Status != "CANCELLED" {
		t.Errorf("cancel: got %+v, want CANCELLED", c)
	}
	r = e.post(t, apitest.UserKey, `mutation { cancelAgentRun(id: "`+apitest.RunDone+`") { agentRun { id } } }`, nil)
	if r.code(0) != "INVALID_STATE" {
		t.Errorf("cancel of a final run: got %q, want INVALID_STATE", r.code(0))
	}
}

func TestAgentRunEventsSSE(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	_, sc := postSSEVars(t, e, apitest.UserKey, `subscription($id: ID!, $a: String) { agentRunEvents(runId: $id, after: $a) {
		cursor kind run { id status } stream data dataBase64 missedBytes } }`, map[string]any{"id": apitest.RunRunning, "a": "3-0"})
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
	if c := e.fake.Last("AgentRunEvents"); c.ID != apitest.RunRunning || c.After != "3-0" {
		t.Errorf("got AgentRunEvents[%s %s], want [%s 3-0]", c.ID, c.After, apitest.RunRunning)
	}
}
