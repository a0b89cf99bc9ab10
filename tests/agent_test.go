package tests

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"sandboxd/tests/e2e"
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

func startRun(t *testing.T, s *e2e.Server, body string, headers ...string) agentRunJSON {
	t.Helper()
	r := s.Curl(t, http.MethodPost, agentRuns, []byte(body), append([]string{e2e.HdrJSON}, headers...)...)
	r.Want(t, http.StatusCreated)
	var run agentRunJSON
	r.Decode(t, &run)
	return run
}

func getRun(t *testing.T, s *e2e.Server, id string) agentRunJSON {
	t.Helper()
	r := s.Curl(t, http.MethodGet, agentRuns+"/"+id, nil, e2e.HdrTenant1)
	r.Want(t, http.StatusOK)
	var run agentRunJSON
	r.Decode(t, &run)
	return run
}

// TestAgentRuns drives the product document's "Continue with an agent" through REST: a run
// outlives its request, changes the workspace, leaves the sandbox running and usable; every
// rejection rule; a missing binary; cancel kills the agent's whole process tree.
func TestAgentRuns(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{Extra: map[string]any{"agents": agentCatalog()}})
	sb := s.Create(t, `{}`, e2e.HdrTenant1)
	id := sb.SandboxID
	var run agentRunJSON

	e2e.Step(t, "run-outlives-its-request", func(t *testing.T) {
		// The document's body, with the test agent; the client goes away after the answer.
		c := &http.Client{Transport: &http.Transport{}}
		body := e2e.MustJSON(t, map[string]any{"agent_id": "tester", "model": "wandb/moonshotai/Kimi-K2.5",
			"instruction": "Continue from the current files and fix the next failure", "sandbox_id": id,
			"config": map[string]any{"temperature": 0.2}})
		r, err := s.SendVia(context.Background(), c, http.MethodPost, agentRuns, strings.NewReader(body), e2e.HdrJSON, e2e.HdrTenant1)
		if err != nil {
			t.Fatal(err)
		}
		c.CloseIdleConnections()
		r.Want(t, http.StatusCreated)
		r.Decode(t, &run)
		if run.Status != "RUNNING" || run.ExecID == "" || run.SandboxID != id || run.AgentID != "tester" ||
			run.RunDir != "/workspace/.agent-runs/"+run.RunID {
			t.Fatalf("start: got %+v, want RUNNING with an exec", run)
		}
		e2e.Eventually(t, time.Minute, "the run succeeds", func() (bool, string) {
			got := getRun(t, s, run.RunID)
			return got.Status == "SUCCEEDED", got.Status + " " + got.Reason
		})
		if got := getRun(t, s, run.RunID); got.ExitCode == nil || *got.ExitCode != 0 {
			t.Errorf("exit code: got %v, want 0", got.ExitCode)
		}
	})

	e2e.Step(t, "workspace-change-visible-to-a-later-exec", func(t *testing.T) {
		if got := s.Run(t, id, []string{"cat", "/workspace/agent-result.txt"}, e2e.HdrTenant1); got != "Continue from the current files and fix the next failure" {
			t.Errorf("agent-result.txt: got %q", got)
		}
		if got := s.Run(t, id, []string{"cat", "/workspace/agent-config.json"}, e2e.HdrTenant1); got != `{"temperature":0.2}` {
			t.Errorf("agent-config.json: got %q", got)
		}
		if got := s.Run(t, id, []string{"ls", run.RunDir}, e2e.HdrTenant1); got != "config.json\ninstruction.md\n" {
			t.Errorf("run folder: got %q, want config.json and instruction.md", got)
		}
		if got := s.Get(t, id, e2e.HdrTenant1); got.State != "RUNNING" {
			t.Errorf("sandbox after the run: got %s, want RUNNING", got.State)
		}
	})

	e2e.Step(t, "list-and-events", func(t *testing.T) {
		r := s.Curl(t, http.MethodGet, agentRuns+"?sandbox_id="+id, nil, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
		var l struct{ Runs []agentRunJSON }
		r.Decode(t, &l)
		if len(l.Runs) != 1 || l.Runs[0].RunID != run.RunID || l.Runs[0].Status != "SUCCEEDED" {
			t.Errorf("list: got %+v, want the run", l.Runs)
		}
		ev := s.Curl(t, http.MethodGet, agentRuns+"/"+run.RunID+"/events", nil, e2e.HdrTenant1, "Accept: text/event-stream")
		ev.Want(t, http.StatusOK)
		text := string(ev.Body)
		if !strings.HasPrefix(text, "event: status\n") || !strings.Contains(text, `"data":"agent wandb/moonshotai/Kimi-K2.5 reads `+run.RunDir+`/instruction.md\n"`) {
			t.Errorf("events: got %q, want status then the agent's output", text)
		}
	})

	e2e.Step(t, "rejections", func(t *testing.T) {
		post := func(body map[string]any, headers ...string) *e2e.Response {
			return s.Curl(t, http.MethodPost, agentRuns, []byte(e2e.MustJSON(t, body)), append([]string{e2e.HdrJSON}, headers...)...)
		}
		base := func() map[string]any {
			return map[string]any{"agent_id": "tester", "model": "m", "instruction": "x", "sandbox_id": id}
		}
		b := base()
		b["pass_at_k"] = 2
		post(b, e2e.HdrTenant1).WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "pass_at_k", "harbor")
		b = base()
		b["agent_id"] = "graded"
		post(b, e2e.HdrTenant1).WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "integration: sandbox")
		b["agent_id"] = "nope"
		post(b, e2e.HdrTenant1).WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "unknown agent")
		b = base()
		b["instruction"] = strings.Repeat("x", 300<<10)
		post(b, e2e.HdrTenant1).WantError(t, http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", "instruction")
		post(base(), e2e.HdrTenant2).WantError(t, http.StatusNotFound, "NOT_FOUND")
		s.Curl(t, http.MethodGet, agentRuns+"/"+run.RunID, nil, e2e.HdrTenant2).WantError(t, http.StatusNotFound, "NOT_FOUND")
		s.Curl(t, http.MethodPost, agentRuns+"/"+run.RunID+"/cancel", nil, e2e.HdrTenant2).WantError(t, http.StatusNotFound, "NOT_FOUND")
		s.Curl(t, http.MethodPost, agentRuns+"/"+run.RunID+"/cancel", nil, e2e.HdrTenant1).WantError(t, http.StatusConflict, "INVALID_STATE", "SUCCEEDED")
		stopped := s.Create(t, `{}`, e2e.HdrTenant1)
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+stopped.SandboxID+"/stop", nil, e2e.HdrTenant1).Want(t, http.StatusOK)
		b = base()
		b["sandbox_id"] = stopped.SandboxID
		post(b, e2e.HdrTenant1).WantError(t, http.StatusConflict, "INVALID_STATE", "STOPPED")
	})

	e2e.Step(t, "document-body-verbatim", func(t *testing.T) {
		// The product document's body, as written; the session image lacks the opencode CLI.
		got := startRun(t, s, `{
  "agent_id": "opencode",
  "model": "wandb/moonshotai/Kimi-K2.5",
  "instruction": "Continue from the current files and fix the next failure",
  "sandbox_id": "`+id+`"
}`, e2e.HdrTenant1)
		if got.Status != "FAILED" || !strings.Contains(got.Reason, `"opencode" is not in the sandbox's image`) || got.Model != "wandb/moonshotai/Kimi-K2.5" {
			t.Errorf("got %+v, want FAILED saying the opencode CLI is not in the image", got)
		}
		if got := s.Run(t, id, []string{"cat", got.RunDir + "/instruction.md"}, e2e.HdrTenant1); got != "Continue from the current files and fix the next failure" {
			t.Errorf("uploaded instruction: got %q", got)
		}
	})

	e2e.Step(t, "missing-binary-fails-with-the-reason", func(t *testing.T) {
		got := startRun(t, s, e2e.MustJSON(t, map[string]any{"agent_id": "missing", "instruction": "x", "sandbox_id": id}), e2e.HdrTenant1)
		if got.Status != "FAILED" || !strings.Contains(got.Reason, `"no-such-agent-cli" is not in the sandbox's image`) {
			t.Errorf("got %+v, want FAILED saying the binary is missing", got)
		}
	})

	e2e.Step(t, "cancel-kills-the-process-tree", func(t *testing.T) {
		got := startRun(t, s, e2e.MustJSON(t, map[string]any{"agent_id": "sleeper", "instruction": "wait", "sandbox_id": id}), e2e.HdrTenant1)
		if got.Status != "RUNNING" {
			t.Fatalf("start: got %+v, want RUNNING", got)
		}
		count := []string{"sh", "-c", `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 30[01]' || true`}
		e2e.Eventually(t, 30*time.Second, "the agent's processes run", func() (bool, string) {
			n := s.Run(t, id, count, e2e.HdrTenant1)
			return n == "2\n", n
		})
		r := s.Curl(t, http.MethodPost, agentRuns+"/"+got.RunID+"/cancel", nil, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
		r.Decode(t, &got)
		if got.Status != "CANCELLED" {
			t.Fatalf("cancel: got %+v, want CANCELLED", got)
		}
		if n := s.Run(t, id, count, e2e.HdrTenant1); n != "0\n" {
			t.Errorf("agent processes after the cancel: got %q, want 0", n)
		}
		if got := getRun(t, s, got.RunID); got.Status != "CANCELLED" {
			t.Errorf("get after the cancel: got %s, want CANCELLED", got.Status)
		}
	})

	e2e.Step(t, "graphql", func(t *testing.T) {
		const fields = `id sandboxId agentId status reason execId exitCode runDir`
		var g struct {
			ID, Status, RunDir string
			ExitCode           *int
		}
		s.GQL(t, `mutation($in: StartAgentRunInput!) { startAgentRun(input: $in) { agentRun { `+fields+` } } }`, map[string]any{"in": map[string]any{
			"agentId": "tester", "model": "gql-model", "instruction": "from graphql", "sandboxId": id, "config": map[string]any{"via": "gql"}}},
			e2e.HdrTenant1).OK(t, "startAgentRun.agentRun", &g)
		if g.Status != "RUNNING" {
			t.Fatalf("startAgentRun: got %+v, want RUNNING", g)
		}
		e2e.Eventually(t, time.Minute, "the GraphQL run succeeds", func() (bool, string) {
			s.GQL(t, `query($id: ID!) { agentRun(id: $id) { `+fields+` } }`, map[string]any{"id": g.ID}, e2e.HdrTenant1).OK(t, "agentRun", &g)
			return g.Status == "SUCCEEDED", g.Status
		})
		if g.ExitCode == nil || *g.ExitCode != 0 {
			t.Errorf("exit code: got %v, want 0", g.ExitCode)
		}
		if got := s.Run(t, id, []string{"cat", "/workspace/agent-result.txt", "/workspace/agent-config.json"}, e2e.HdrTenant1); got != `from graphql{"via":"gql"}` {
			t.Errorf("workspace after the GraphQL run: got %q", got)
		}
		var runs struct{ Nodes []struct{ ID string } }
		s.GQL(t, `query($sb: ID!) { agentRuns(sandboxId: $sb) { nodes { id } } }`, map[string]any{"sb": id}, e2e.HdrTenant1).OK(t, "agentRuns", &runs)
		list := runs.Nodes
		if len(list) < 2 || list[0].ID != g.ID || list[len(list)-1].ID != run.RunID {
			t.Errorf("agentRuns: got %+v, want the GraphQL run first and the first run last", list)
		}
		// One run per page, in the same order, hasNextPage until the last.
		const pageQ = `query($sb: ID!, $after: String) { agentRuns(sandboxId: $sb, first: 1, after: $after) {
			edges { cursor node { id } } pageInfo { hasNextPage endCursor } } }`
		var paged []string
		after := any(nil)
		for range len(list) + 1 {
			var p struct {
				Edges []struct {
					Cursor string
					Node   struct{ ID string }
				}
				PageInfo struct {
					HasNextPage bool
					EndCursor   *string
				}
			}
			s.GQL(t, pageQ, map[string]any{"sb": id, "after": after}, e2e.HdrTenant1).OK(t, "agentRuns", &p)
			if len(p.Edges) != 1 || p.PageInfo.EndCursor == nil || *p.PageInfo.EndCursor != p.Edges[0].Cursor {
				t.Fatalf("agentRuns page %d: got %+v, want one run and its cursor as endCursor", len(paged), p)
			}
			paged = append(paged, p.Edges[0].Node.ID)
			if !p.PageInfo.HasNextPage {
				break
			}
			after = *p.PageInfo.EndCursor
		}
		if fmt.Sprint(paged) != fmt.Sprint(runIDs(list)) {
			t.Errorf("agentRuns pages: got %v, want %v", paged, runIDs(list))
		}
		// Another tenant: NOT_FOUND; hostile page arguments: INVALID_ARGUMENT.
		s.GQL(t, pageQ, map[string]any{"sb": id}, e2e.HdrTenant2).WantCode(t, http.StatusOK, "NOT_FOUND")
		s.GQL(t, `query($sb: ID!) { agentRuns(sandboxId: $sb, first: 101) { nodes { id } } }`, map[string]any{"sb": id}, e2e.HdrTenant1).
			WantCode(t, http.StatusOK, "INVALID_ARGUMENT")
		s.GQL(t, pageQ, map[string]any{"sb": id, "after": "run_../../x"}, e2e.HdrTenant1).WantCode(t, http.StatusOK, "INVALID_ARGUMENT")
		sub := s.Curl(t, http.MethodPost, "/graphql", []byte(e2e.MustJSON(t, map[string]any{
			"query":     `subscription($id: ID!) { agentRunEvents(runId: $id) { cursor kind run { status } stream data } }`,
			"variables": map[string]any{"id": g.ID}})), e2e.HdrJSON, e2e.HdrTenant1, "Accept: text/event-stream")
		sub.Want(t, http.StatusOK)
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
		const start = `mutation($in: StartAgentRunInput!) { startAgentRun(input: $in) { agentRun { id status } } }`
		s.GQL(t, start, in("tester", map[string]any{"model": "m", "passAtK": 2}), e2e.HdrTenant1).WantCode(t, 0, "INVALID_ARGUMENT", "harbor")
		s.GQL(t, start, in("graded", nil), e2e.HdrTenant1).WantCode(t, 0, "INVALID_ARGUMENT", "integration: sandbox")
		s.GQL(t, start, in("sleeper", nil), e2e.HdrTenant2).WantCode(t, 0, "NOT_FOUND")
		s.GQL(t, `query($id: ID!) { agentRun(id: $id) { id } }`, map[string]any{"id": g.ID}, e2e.HdrTenant2).WantCode(t, 0, "NOT_FOUND")
		s.GQL(t, start, in("sleeper", nil), e2e.HdrTenant1).OK(t, "startAgentRun.agentRun", &g)
		s.GQL(t, `mutation($id: ID!) { cancelAgentRun(id: $id) { agentRun { id status } } }`, map[string]any{"id": g.ID}, e2e.HdrTenant1).OK(t, "cancelAgentRun.agentRun", &g)
		if g.Status != "CANCELLED" {
			t.Errorf("cancelAgentRun: got %s, want CANCELLED", g.Status)
		}
	})

	e2e.Step(t, "sandbox-usable-after-the-runs", func(t *testing.T) {
		if got := s.Get(t, id, e2e.HdrTenant1); got.State != "RUNNING" {
			t.Errorf("sandbox: got %s, want RUNNING", got.State)
		}
		if got := s.Run(t, id, []string{"echo", "still here"}, e2e.HdrTenant1); got != "still here\n" {
			t.Errorf("exec: got %q", got)
		}
	})
}

// runIDs are the ids of a list of runs, in order.
func runIDs(runs []struct{ ID string }) []string {
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.ID
	}
	return out
}
