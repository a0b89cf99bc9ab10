package rest

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/apierror"
	"sandboxd/internal/sandbox"
)

// TestAgentRunStartBody: the product document's body, exactly, starts a run (201).
func TestAgentRunStartBody(t *testing.T) {
	f := apitest.New()
	h := newTestHandler(t, f)
	rec := serve(t, h, http.MethodPost, AgentPrefix+"/runs", `{
  "agent_id": "opencode",
  "model": "wandb/moonshotai/Kimi-K2.5",
  "instruction": "Continue from the current files and fix the next failure",
  "sandbox_id": "`+apitest.SandboxRunning+`"
}`)
	if rec.Code != http.StatusCreated {
		t.Fatalf("got %d %s, want 201", rec.Code, rec.Body)
	}
	m := decodeObject(t, rec.Body.Bytes())
	for k, v := range map[string]any{"run_id": apitest.RunRunning, "sandbox_id": apitest.SandboxRunning, "agent_id": "opencode", "status": "RUNNING",
		"exec_id": apitest.ExecRunning, "run_dir": "/workspace/.agent-runs/" + apitest.RunRunning} {
		if m[k] != v {
			t.Errorf("%s: got %v, want %v", k, m[k], v)
		}
	}
	want := sandbox.AgentRunRequest{AgentID: "opencode", Model: "wandb/moonshotai/Kimi-K2.5",
		Instruction: "Continue from the current files and fix the next failure", SandboxID: apitest.SandboxRunning}
	if got := f.CallsTo("StartAgentRun")[0].AgentRun; got.AgentID != want.AgentID || got.Model != want.Model || got.Instruction != want.Instruction ||
		got.SandboxID != want.SandboxID || got.PassAtK != 0 || got.Config != nil {
		t.Errorf("request: got %+v, want %+v", got, want)
	}
	rec = serve(t, h, http.MethodPost, AgentPrefix+"/runs", `{"agent_id":"opencode","model":"m","instruction":"x","sandbox_id":"`+apitest.SandboxRunning+`","pass_at_k":1,"config":{"a":[1,2]}}`)
	if rec.Code != http.StatusCreated {
		t.Fatalf("with pass_at_k and config: got %d %s, want 201", rec.Code, rec.Body)
	}
	if got := f.CallsTo("StartAgentRun")[1].AgentRun; got.PassAtK != 1 || string(got.Config) != `{"a":[1,2]}` {
		t.Errorf("request: got pass_at_k %d config %s, want 1 {\"a\":[1,2]}", got.PassAtK, got.Config)
	}
	// "config": null is no config, as GraphQL's null is.
	rec = serve(t, h, http.MethodPost, AgentPrefix+"/runs", `{"agent_id":"opencode","model":"m","instruction":"x","sandbox_id":"`+apitest.SandboxRunning+`","config": null}`)
	if rec.Code != http.StatusCreated {
		t.Fatalf("with config null: got %d %s, want 201", rec.Code, rec.Body)
	}
	if got := f.CallsTo("StartAgentRun")[2].AgentRun; got.Config != nil {
		t.Errorf("config null: got config %q, want none", got.Config)
	}
}

func TestAgentRunStartErrors(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		err        error
		status     int
		code       string
	}{
		{"unknown_field", `{"agent":"x"}`, nil, 400, "INVALID_ARGUMENT"},
		{"empty", ``, nil, 400, "INVALID_ARGUMENT"},
		{"pass_at_k_zero", `{"agent_id":"a","pass_at_k":0}`, nil, 400, "INVALID_ARGUMENT"},
		{"pass_at_k_with_sandbox", `{"agent_id":"a","sandbox_id":"s","pass_at_k":3}`,
			apierror.New(apierror.InvalidArgument, "sandbox_id with pass_at_k > 1 is rejected: use Harbor"), 400, "INVALID_ARGUMENT"},
		{"not_running", `{"agent_id":"a"}`, apierror.New(apierror.InvalidState, "sandbox is STOPPED"), 409, "INVALID_STATE"},
		{"too_large", `{"agent_id":"a"}`, apierror.New(apierror.PayloadTooLarge, "instruction is too large"), 413, "PAYLOAD_TOO_LARGE"},
		{"other_tenant", `{"agent_id":"a"}`, apierror.New(apierror.NotFound, "sandbox not found"), 404, "NOT_FOUND"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := apitest.New()
			f.RunErr = tc.err
			rec := serve(t, newTestHandler(t, f), http.MethodPost, AgentPrefix+"/runs", tc.body)
			if rec.Code != tc.status || !strings.Contains(rec.Body.String(), `"code":"`+tc.code+`"`) {
				t.Fatalf("got %d %s, want %d %s", rec.Code, rec.Body, tc.status, tc.code)
			}
		})
	}
}

func TestAgentRunGetListCancel(t *testing.T) {
	f := apitest.New()
	h := newTestHandler(t, f)
	if rec := serve(t, h, http.MethodGet, AgentPrefix+"/runs/"+apitest.RunRunning, ""); rec.Code != 200 || decodeObject(t, rec.Body.Bytes())["status"] != "RUNNING" {
		t.Errorf("get: got %d %s, want 200 RUNNING", rec.Code, rec.Body)
	}
	if rec := serve(t, h, http.MethodGet, AgentPrefix+"/runs/run_nope", ""); rec.Code != 404 {
		t.Errorf("get unknown: got %d, want 404", rec.Code)
	}
	rec := serve(t, h, http.MethodGet, AgentPrefix+"/runs?sandbox_id="+apitest.SandboxRunning, "")
	var list struct {
		Runs []struct {
			RunID string `json:"run_id"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &list); err != nil || rec.Code != 200 || len(list.Runs) != 2 ||
		list.Runs[0].RunID != apitest.RunDone || list.Runs[1].RunID != apitest.RunRunning ||
		!strings.Contains(rec.Body.String(), `"runs":[{"run_id":"`+apitest.RunDone+`"`) {
		t.Errorf("list: got %d %s, want 200 with the sandbox's runs in the service's order (%s, %s)", rec.Code, rec.Body,
			apitest.RunDone, apitest.RunRunning)
	}
	if rec := serve(t, h, http.MethodGet, AgentPrefix+"/runs", ""); rec.Code != 400 {
		t.Errorf("list without sandbox_id: got %d, want 400", rec.Code)
	}
	if rec := serve(t, h, http.MethodPost, AgentPrefix+"/runs/"+apitest.RunRunning+"/cancel", `{"x":1}`); rec.Code != 400 {
		t.Errorf("cancel with a body: got %d, want 400", rec.Code)
	}
	rec = serve(t, h, http.MethodPost, AgentPrefix+"/runs/"+apitest.RunRunning+"/cancel", "")
	if rec.Code != 200 || decodeObject(t, rec.Body.Bytes())["status"] != "CANCELLED" {
		t.Errorf("cancel: got %d %s, want 200 CANCELLED", rec.Code, rec.Body)
	}
	if rec := serve(t, h, http.MethodPost, AgentPrefix+"/runs/"+apitest.RunRunning+"/cancel", ""); rec.Code != 409 {
		t.Errorf("cancel again: got %d %s, want 409", rec.Code, rec.Body)
	}
	if rec := serve(t, h, http.MethodGet, AgentPrefix+"/nothing", ""); rec.Code != 404 {
		t.Errorf("unknown path: got %d, want 404", rec.Code)
	}
}

func TestAgentRunEventsSSE(t *testing.T) {
	f := apitest.New()
	run := f.Runs[apitest.RunRunning]
	done := run
	done.Status, done.EndedAt = sandbox.RunSucceeded, t1
	f.RunEvents = []sandbox.AgentRunEvent{
		{Kind: sandbox.AgentRunStatusEvent, Cursor: "", Run: &run},
		{Kind: sandbox.AgentRunChunk, Cursor: "6-0", Stream: "stdout", Data: []byte("hello\n")},
		{Kind: sandbox.AgentRunStatusEvent, Cursor: "6-1", Run: &done},
	}
	srv := httptest.NewServer(newTestHandler(t, f))
	defer srv.Close()
	req := newRequest(t, context.Background(), http.MethodGet, srv.URL+AgentPrefix+"/runs/"+apitest.RunRunning+"/events?after=3-0", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("got %d %s, want 200 text/event-stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	evs := readEvents(t, resp.Body, func(sseEvent) bool { return false })
	var got []sseEvent
	for _, ev := range evs {
		if ev.Comment == "" {
			got = append(got, ev)
		}
	}
	if len(got) != 3 || got[0].Event != "status" || got[1].Event != "chunk" || got[1].ID != "6-0" ||
		!strings.Contains(got[1].Data, `"data":"hello\n"`) || got[2].Event != "status" || !strings.Contains(got[2].Data, `"status":"SUCCEEDED"`) {
		t.Fatalf("events: got %+v", evs)
	}
	if after := f.CallsTo("AgentRunEvents")[0].After; after != "3-0" {
		t.Errorf("after: got %q, want 3-0", after)
	}
	f.WaitStreams(t, 5*time.Second)
}
