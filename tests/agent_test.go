package tests

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

const agentRuns = "/sandbox/agent/v1/runs"

// agentCatalog is the catalog of TestAgentRuns: "tester" is a shell script (sh is in the test
// profile's image) that reads its instruction and config and changes the workspace; "sleeper"
// runs until it is cancelled; "missing" needs a binary the image lacks; "graded" is a
// Harbor-only agent.
func agentCatalog() []map[string]any {
	return []map[string]any{
		{"id": "tester", "integrations": []string{"sandbox", "harbor"}, "binary": "sh", "command": []string{"sh", "-c",
			`echo "agent $3 reads $1"; cp "$1" /workspace/agent-result.txt; cp "$2" /workspace/agent-config.json; sleep 2; echo done`,
			"agent", "{{instruction_file}}", "{{config_file}}", "{{model}}"}},
		{"id": "sleeper", "integrations": []string{"sandbox"}, "binary": "sh",
			"command": []string{"sh", "-c", "sleep 300 & sleep 301; wait"}},
		{"id": "missing", "integrations": []string{"sandbox"}, "binary": "no-such-agent-cli",
			"command": []string{"no-such-agent-cli", "run", "{{instruction_file}}"}},
		{"id": "graded", "integrations": []string{"harbor"}, "binary": "sh", "command": []string{"true"}},
		// The default catalog's entry; the test image has no opencode CLI.
		{"id": "opencode", "integrations": []string{"sandbox", "harbor"}, "binary": "opencode",
			"command": []string{"opencode", "run", "--model", "{{model}}", "--file", "{{instruction_file}}", "Follow the attached instruction."}},
	}
}

type agentRunJSON struct {
	RunID     string `json:"run_id"`
	SandboxID string `json:"sandbox_id"`
	AgentID   string `json:"agent_id"`
	Model     string `json:"model"`
	Status    string `json:"status"`
	Reason    string `json:"reason"`
	ExecID    string `json:"exec_id"`
	ExitCode  *int   `json:"exit_code"`
	Signal    string `json:"signal"`
	RunDir    string `json:"run_dir"`
}

func (s *Server) startRun(t *testing.T, body string, headers ...string) agentRunJSON {
	t.Helper()
	r := s.curl(t, http.MethodPost, agentRuns, []byte(body), append([]string{hdrJSON}, headers...)...)
	r.want(t, http.StatusCreated)
	var run agentRunJSON
	r.decode(t, &run)
	return run
}

func (s *Server) getRun(t *testing.T, id string) agentRunJSON {
	t.Helper()
	r := s.curl(t, http.MethodGet, agentRuns+"/"+id, nil, hdrTenant1)
	r.want(t, http.StatusOK)
	var run agentRunJSON
	r.decode(t, &run)
	return run
}

// TestAgentRuns drives the product document's "Continue with an agent" through REST: a run
// outlives its request, changes the workspace, leaves the sandbox running and usable; every
// rejection rule; a missing binary; cancel kills the agent's whole process tree.
func TestAgentRuns(t *testing.T) {
	s := startServer(t, serverOptions{Extra: map[string]any{"agents": agentCatalog()}})
	sb := s.create(t, `{}`, hdrTenant1)
	id := sb.SandboxID
	var run agentRunJSON

	step(t, "run-outlives-its-request", func(t *testing.T) {
		// The document's body, with the test agent; the client goes away after the answer.
		c := &http.Client{Transport: &http.Transport{}}
		body := mustJSON(t, map[string]any{"agent_id": "tester", "model": "wandb/moonshotai/Kimi-K2.5",
			"instruction": "Continue from the current files and fix the next failure", "sandbox_id": id,
			"config": map[string]any{"temperature": 0.2}})
		r, err := s.sendVia(context.Background(), c, http.MethodPost, agentRuns, strings.NewReader(body), hdrJSON, hdrTenant1)
		if err != nil {
			t.Fatal(err)
		}
		c.CloseIdleConnections()
		r.want(t, http.StatusCreated)
		r.decode(t, &run)
		if run.Status != "RUNNING" || run.ExecID == "" || run.SandboxID != id || run.AgentID != "tester" ||
			run.RunDir != "/workspace/.agent-runs/"+run.RunID {
			t.Fatalf("start: got %+v, want RUNNING with an exec", run)
		}
		eventually(t, time.Minute, "the run succeeds", func() (bool, string) {
			got := s.getRun(t, run.RunID)
			return got.Status == "SUCCEEDED", got.Status + " " + got.Reason
		})
		if got := s.getRun(t, run.RunID); got.ExitCode == nil || *got.ExitCode != 0 {
			t.Errorf("exit code: got %v, want 0", got.ExitCode)
		}
	})

	step(t, "workspace-change-visible-to-a-later-exec", func(t *testing.T) {
		if got := s.run(t, id, []string{"cat", "/workspace/agent-result.txt"}, hdrTenant1); got != "Continue from the current files and fix the next failure" {
			t.Errorf("agent-result.txt: got %q", got)
		}
		if got := s.run(t, id, []string{"cat", "/workspace/agent-config.json"}, hdrTenant1); got != `{"temperature":0.2}` {
			t.Errorf("agent-config.json: got %q", got)
		}
		if got := s.run(t, id, []string{"ls", run.RunDir}, hdrTenant1); got != "config.json\ninstruction.md\n" {
			t.Errorf("run folder: got %q, want config.json and instruction.md", got)
		}
		if got := s.get(t, id, hdrTenant1); got.State != "RUNNING" {
			t.Errorf("sandbox after the run: got %s, want RUNNING", got.State)
		}
	})

	step(t, "list-and-events", func(t *testing.T) {
		r := s.curl(t, http.MethodGet, agentRuns+"?sandbox_id="+id, nil, hdrTenant1)
		r.want(t, http.StatusOK)
		var l struct{ Runs []agentRunJSON }
		r.decode(t, &l)
		if len(l.Runs) != 1 || l.Runs[0].RunID != run.RunID || l.Runs[0].Status != "SUCCEEDED" {
			t.Errorf("list: got %+v, want the run", l.Runs)
		}
		ev := s.curl(t, http.MethodGet, agentRuns+"/"+run.RunID+"/events", nil, hdrTenant1, "Accept: text/event-stream")
		ev.want(t, http.StatusOK)
		text := string(ev.Body)
		if !strings.HasPrefix(text, "event: status\n") || !strings.Contains(text, `"data":"agent wandb/moonshotai/Kimi-K2.5 reads `+run.RunDir+`/instruction.md\n"`) {
			t.Errorf("events: got %q, want status then the agent's output", text)
		}
	})

	step(t, "rejections", func(t *testing.T) {
		post := func(body map[string]any, headers ...string) *Response {
			return s.curl(t, http.MethodPost, agentRuns, []byte(mustJSON(t, body)), append([]string{hdrJSON}, headers...)...)
		}
		base := func() map[string]any {
			return map[string]any{"agent_id": "tester", "model": "m", "instruction": "x", "sandbox_id": id}
		}
		b := base()
		b["pass_at_k"] = 2
		post(b, hdrTenant1).wantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "pass_at_k", "harbor")
		b = base()
		b["agent_id"] = "graded"
		post(b, hdrTenant1).wantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "integration: sandbox")
		b["agent_id"] = "nope"
		post(b, hdrTenant1).wantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "unknown agent")
		b = base()
		b["instruction"] = strings.Repeat("x", 300<<10)
		post(b, hdrTenant1).wantError(t, http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", "instruction")
		post(base(), hdrTenant2).wantError(t, http.StatusNotFound, "NOT_FOUND")
		s.curl(t, http.MethodGet, agentRuns+"/"+run.RunID, nil, hdrTenant2).wantError(t, http.StatusNotFound, "NOT_FOUND")
		s.curl(t, http.MethodPost, agentRuns+"/"+run.RunID+"/cancel", nil, hdrTenant2).wantError(t, http.StatusNotFound, "NOT_FOUND")
		s.curl(t, http.MethodPost, agentRuns+"/"+run.RunID+"/cancel", nil, hdrTenant1).wantError(t, http.StatusConflict, "INVALID_STATE", "SUCCEEDED")
		stopped := s.create(t, `{}`, hdrTenant1)
		s.curl(t, http.MethodPost, prefix+"/"+stopped.SandboxID+"/stop", nil, hdrTenant1).want(t, http.StatusOK)
		b = base()
		b["sandbox_id"] = stopped.SandboxID
		post(b, hdrTenant1).wantError(t, http.StatusConflict, "INVALID_STATE", "STOPPED")
	})

	step(t, "document-body-verbatim", func(t *testing.T) {
		// The product document's body, as written; the session image lacks the opencode CLI.
		got := s.startRun(t, `{
  "agent_id": "opencode",
  "model": "wandb/moonshotai/Kimi-K2.5",
  "instruction": "Continue from the current files and fix the next failure",
  "sandbox_id": "`+id+`"
}`, hdrTenant1)
		if got.Status != "FAILED" || !strings.Contains(got.Reason, `"opencode" is not in the sandbox's image`) || got.Model != "wandb/moonshotai/Kimi-K2.5" {
			t.Errorf("got %+v, want FAILED saying the opencode CLI is not in the image", got)
		}
		if got := s.run(t, id, []string{"cat", got.RunDir + "/instruction.md"}, hdrTenant1); got != "Continue from the current files and fix the next failure" {
			t.Errorf("uploaded instruction: got %q", got)
		}
	})

	step(t, "missing-binary-fails-with-the-reason", func(t *testing.T) {
		got := s.startRun(t, mustJSON(t, map[string]any{"agent_id": "missing", "instruction": "x", "sandbox_id": id}), hdrTenant1)
		if got.Status != "FAILED" || !strings.Contains(got.Reason, `"no-such-agent-cli" is not in the sandbox's image`) {
			t.Errorf("got %+v, want FAILED saying the binary is missing", got)
		}
	})

	step(t, "cancel-kills-the-process-tree", func(t *testing.T) {
		got := s.startRun(t, mustJSON(t, map[string]any{"agent_id": "sleeper", "instruction": "wait", "sandbox_id": id}), hdrTenant1)
		if got.Status != "RUNNING" {
			t.Fatalf("start: got %+v, want RUNNING", got)
		}
		count := []string{"sh", "-c", `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 30[01]' || true`}
		eventually(t, 30*time.Second, "the agent's processes run", func() (bool, string) {
			n := s.run(t, id, count, hdrTenant1)
			return n == "2\n", n
		})
		r := s.curl(t, http.MethodPost, agentRuns+"/"+got.RunID+"/cancel", nil, hdrTenant1)
		r.want(t, http.StatusOK)
		r.decode(t, &got)
		if got.Status != "CANCELLED" {
			t.Fatalf("cancel: got %+v, want CANCELLED", got)
		}
		if n := s.run(t, id, count, hdrTenant1); n != "0\n" {
			t.Errorf("agent processes after the cancel: got %q, want 0", n)
		}
		if got := s.getRun(t, got.RunID); got.Status != "CANCELLED" {
			t.Errorf("get after the cancel: got %s, want CANCELLED", got.Status)
		}
	})

	step(t, "graphql", func(t *testing.T) {
		const fields = `id sandboxId agentId status reason execId exitCode runDir`
		var g struct {
			ID, Status, RunDir string
			ExitCode           *int
		}
		s.gql(t, `mutation($in: StartAgentRunInput!) { startAgentRun(input: $in) { `+fields+` } }`, map[string]any{"in": map[string]any{
			"agentId": "tester", "model": "gql-model", "instruction": "from graphql", "sandboxId": id, "config": map[string]any{"via": "gql"}}},
			hdrTenant1).ok(t, "startAgentRun", &g)
		if g.Status != "RUNNING" {
			t.Fatalf("startAgentRun: got %+v, want RUNNING", g)
		}
		eventually(t, time.Minute, "the GraphQL run succeeds", func() (bool, string) {
			s.gql(t, `query($id: ID!) { agentRun(id: $id) { `+fields+` } }`, map[string]any{"id": g.ID}, hdrTenant1).ok(t, "agentRun", &g)
			return g.Status == "SUCCEEDED", g.Status
		})
		if g.ExitCode == nil || *g.ExitCode != 0 {
			t.Errorf("exit code: got %v, want 0", g.ExitCode)
		}
		if got := s.run(t, id, []string{"cat", "/workspace/agent-result.txt", "/workspace/agent-config.json"}, hdrTenant1); got != `from graphql{"via":"gql"}` {
			t.Errorf("workspace after the GraphQL run: got %q", got)
		}
		var list []struct{ ID string }
		s.gql(t, `query($sb: ID!) { agentRuns(sandboxId: $sb) { id } }`, map[string]any{"sb": id}, hdrTenant1).ok(t, "agentRuns", &list)
		if len(list) < 2 || list[0].ID != g.ID || list[len(list)-1].ID != run.RunID {
			t.Errorf("agentRuns: got %+v, want the GraphQL run first and the first run last", list)
		}
		sub := s.curl(t, http.MethodPost, "/graphql", []byte(mustJSON(t, map[string]any{
			"query":     `subscription($id: ID!) { agentRunEvents(runId: $id) { cursor kind run { status } stream data } }`,
			"variables": map[string]any{"id": g.ID}})), hdrJSON, hdrTenant1, "Accept: text/event-stream")
		sub.want(t, http.StatusOK)
		if body := string(sub.Body); !strings.Contains(body, `"kind":"CHUNK","run":null,"stream":"STDOUT","data":"agent gql-model reads`) ||
			!strings.Contains(body, `"status":"SUCCEEDED"`) || !strings.Contains(body, "event: complete") {
			t.Errorf("agentRunEvents: got %q, want output and the final status", body)
		}
		in := func(agent string, extra map[string]any) map[string]any {
			m := map[string]any{"agentId": agent, "instruction": "x", "sandboxId": id}
			for k, v := range extra {
				m[k] = v
			}
			return map[string]any{"in": m}
		}
		const start = `mutation($in: StartAgentRunInput!) { startAgentRun(input: $in) { id status } }`
		s.gql(t, start, in("tester", map[string]any{"model": "m", "passAtK": 2}), hdrTenant1).wantCode(t, 0, "INVALID_ARGUMENT", "harbor")
		s.gql(t, start, in("graded", nil), hdrTenant1).wantCode(t, 0, "INVALID_ARGUMENT", "integration: sandbox")
		s.gql(t, start, in("sleeper", nil), hdrTenant2).wantCode(t, 0, "NOT_FOUND")
		s.gql(t, `query($id: ID!) { agentRun(id: $id) { id } }`, map[string]any{"id": g.ID}, hdrTenant2).wantCode(t, 0, "NOT_FOUND")
		s.gql(t, start, in("sleeper", nil), hdrTenant1).ok(t, "startAgentRun", &g)
		s.gql(t, `mutation($id: ID!) { cancelAgentRun(id: $id) { id status } }`, map[string]any{"id": g.ID}, hdrTenant1).ok(t, "cancelAgentRun", &g)
		if g.Status != "CANCELLED" {
			t.Errorf("cancelAgentRun: got %s, want CANCELLED", g.Status)
		}
	})

	step(t, "sandbox-usable-after-the-runs", func(t *testing.T) {
		if got := s.get(t, id, hdrTenant1); got.State != "RUNNING" {
			t.Errorf("sandbox: got %s, want RUNNING", got.State)
		}
		if got := s.run(t, id, []string{"echo", "still here"}, hdrTenant1); got != "still here\n" {
			t.Errorf("exec: got %q", got)
		}
	})
}
