package agents_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/agents"
	"sandboxd/internal/apierror"
	"sandboxd/internal/domain/domaintest"
	"sandboxd/internal/sandbox"
)

var alice, bob = domaintest.Alice, domaintest.Bob

// busy reports whether a command still runs in the sandbox: what the reconciler asks the
// sandbox's guest init before it auto-stops an idle sandbox.
func busy(t *testing.T, e *domaintest.Env, id string) bool {
	t.Helper()
	ctx := context.Background()
	g, err := e.Svc.Guest(ctx, id)
	if err != nil {
		return false
	}
	execs, err := g.Execs(ctx)
	if err != nil {
		return false
	}
	for _, x := range execs {
		if x.Running {
			return true
		}
	}
	return false
}

// testAgents is the catalog of the agent tests: "tester" is a shell script that reads its
// instruction and config (paths relative to the workspace, where it runs: the fake driver's
// guest runs on the host) and writes a file into the workspace, then lingers a second so that
// the start's answer reliably sees it RUNNING.
func testAgents() []sandbox.AgentConfig {
	return []sandbox.AgentConfig{
		{ID: "tester", Integrations: []string{"sandbox", "harbor"}, Binary: "sh", Command: []string{"sh", "-c",
			`d=".agent-runs/$AGENT_RUN_ID"; echo "model $1"; cp "$d/instruction.md" result.txt; cat "$d/config.json" > config-seen.json; sleep 1; exit "${AGENT_EXIT:-0}"`,
			"agent", "{{model}}"}},
		{ID: "failing", Integrations: []string{"sandbox"}, Binary: "sh", Command: []string{"sh", "-c", "echo broken >&2; exit 3"}},
		{ID: "sleeper", Integrations: []string{"sandbox"}, Binary: "sh", Command: []string{"sh", "-c", "sleep 300 & sleep 300; wait"}},
		{ID: "slow", Integrations: []string{"sandbox"}, Binary: "sh", Command: []string{"sleep", "30"}, TimeoutSec: 1},
		{ID: "missing", Integrations: []string{"sandbox"}, Binary: "no-such-agent-cli", Command: []string{"no-such-agent-cli", "run"}},
		{ID: "graded", Integrations: []string{"harbor"}, Binary: "sh", Command: []string{"true"}},
	}
}

func newAgentEnv(t *testing.T) *domaintest.Env {
	return domaintest.New(t, domaintest.Options{
		Config: func(c *sandbox.Config) { c.Agents = testAgents() },
	})
}

// waitRun polls a run until it is final.
func waitRun(t *testing.T, e *domaintest.Env, id string) sandbox.AgentRun {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := e.Svc.GetAgentRun(context.Background(), alice, id)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status.Terminal() {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s: still %s", id, r.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestAgentRunSucceedsAndChangesTheWorkspace(t *testing.T) {
	e := newAgentEnv(t)
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	r, err := e.Svc.StartAgentRun(ctx, alice, sandbox.AgentRunRequest{AgentID: "tester", Model: "m/x", Instruction: "fix it",
		SandboxID: sb.ID, Config: json.RawMessage(`{"k":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != sandbox.RunRunning || r.ExecID == "" || r.SandboxID != sb.ID || r.RunDir != agents.RunsDir+"/"+r.ID {
		t.Fatalf("start: got %+v, want RUNNING with an exec", r)
	}
	got := waitRun(t, e, r.ID)
	if got.Status != sandbox.RunSucceeded || got.ExitCode != 0 || got.EndedAt.IsZero() {
		t.Fatalf("end: got %+v, want SUCCEEDED", got)
	}
	for path, want := range map[string]string{"result.txt": "fix it", "config-seen.json": `{"k":1}`,
		r.RunDir + "/instruction.md": "fix it"} {
		b, _, err := e.Svc.ReadFile(ctx, alice, sb.ID, path, 1<<20)
		if err != nil || string(b) != want {
			t.Errorf("%s: got %q (%v), want %q", path, b, err, want)
		}
	}
	out, err := e.Svc.GetExec(ctx, alice, sb.ID, got.ExecID, true)
	if err != nil || string(out.Stdout) != "model m/x\n" {
		t.Errorf("agent output: got %q (%v), want %q", out.Stdout, err, "model m/x\n")
	}
	// The sandbox stays RUNNING and usable.
	if sb2, err := e.Svc.Get(ctx, alice, sb.ID); err != nil || sb2.State != sandbox.Running {
		t.Errorf("sandbox after the run: got %v (%v), want RUNNING", sb2.State, err)
	}
	if res := e.MustExec(t, alice, sb.ID, "cat", "result.txt"); string(res.Stdout) != "fix it" {
		t.Errorf("later exec: got %q, want %q", res.Stdout, "fix it")
	}
	// Listing: newest first; another tenant sees nothing.
	r2, err := e.Svc.StartAgentRun(ctx, alice, sandbox.AgentRunRequest{AgentID: "failing", Instruction: "x", SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	if f := waitRun(t, e, r2.ID); f.Status != sandbox.RunFailed || f.ExitCode != 3 || !strings.Contains(f.Reason, "code 3") {
		t.Errorf("failing agent: got %+v, want FAILED with exit 3", f)
	}
	list, err := e.Svc.ListAgentRuns(ctx, alice, sb.ID)
	if err != nil || len(list) != 2 || list[0].ID != r2.ID || list[1].ID != r.ID {
		t.Fatalf("list: got %d runs (%v), want [%s %s]", len(list), err, r2.ID, r.ID)
	}
	// Pages of one: the newest, then the other, then no next page.
	p1, err := e.Svc.AgentRunPage(ctx, alice, sb.ID, sandbox.AgentRunListOptions{Limit: 1})
	if err != nil || len(p1.Runs) != 1 || p1.Runs[0].ID != r2.ID || p1.NextCursor != r2.ID {
		t.Fatalf("first page: got %+v (%v), want %s with a next page", p1, err, r2.ID)
	}
	p2, err := e.Svc.AgentRunPage(ctx, alice, sb.ID, sandbox.AgentRunListOptions{Limit: 1, After: p1.NextCursor})
	if err != nil || len(p2.Runs) != 1 || p2.Runs[0].ID != r.ID || p2.NextCursor != "" {
		t.Fatalf("second page: got %+v (%v), want %s and no next page", p2, err, r.ID)
	}
	for _, opts := range []sandbox.AgentRunListOptions{{Limit: 101}, {After: "exec_01J00000000000000000000000"}, {After: "run_x"}} {
		if _, err := e.Svc.AgentRunPage(ctx, alice, sb.ID, opts); apierror.CodeOf(err) != apierror.InvalidArgument {
			t.Errorf("page %+v: got %v, want INVALID_ARGUMENT", opts, err)
		}
	}
	if _, err := e.Svc.AgentRunPage(ctx, bob, sb.ID, sandbox.AgentRunListOptions{}); apierror.CodeOf(err) != apierror.NotFound {
		t.Errorf("other tenant page: got %v, want NOT_FOUND", err)
	}
	if _, err := e.Svc.GetAgentRun(ctx, bob, r.ID); apierror.CodeOf(err) != apierror.NotFound {
		t.Errorf("other tenant get: got %v, want NOT_FOUND", err)
	}
	if _, err := e.Svc.CancelAgentRun(ctx, bob, r.ID); apierror.CodeOf(err) != apierror.NotFound {
		t.Errorf("other tenant cancel: got %v, want NOT_FOUND", err)
	}
	if _, err := e.Svc.ListAgentRuns(ctx, bob, sb.ID); apierror.CodeOf(err) != apierror.NotFound {
		t.Errorf("other tenant list: got %v, want NOT_FOUND", err)
	}
	if _, err := e.Svc.CancelAgentRun(ctx, alice, r.ID); apierror.CodeOf(err) != apierror.InvalidState {
		t.Errorf("cancel of a finished run: got %v, want INVALID_STATE", err)
	}
	// The event stream: status, output, final status, from any replica.
	ch, err := e.Replica(t).AgentRunEvents(ctx, alice, r.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	var kinds []sandbox.AgentRunEventKind
	var text string
	for ev := range ch {
		kinds = append(kinds, ev.Kind)
		text += string(ev.Data)
	}
	if len(kinds) < 2 || kinds[0] != sandbox.AgentRunStatusEvent || kinds[len(kinds)-1] == sandbox.AgentRunStatusEvent || text != "model m/x\n" {
		t.Errorf("events of a finished run: got %v with %q, want STATUS then CHUNKs", kinds, text)
	}
}

func TestAgentRunEventsFollowALiveRun(t *testing.T) {
	e := newAgentEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sb := e.CreateRunning(t, alice)
	r, err := e.Svc.StartAgentRun(ctx, alice, sandbox.AgentRunRequest{AgentID: "tester", Model: "m", Instruction: "go", SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := e.Svc.AgentRunEvents(ctx, alice, r.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	var last sandbox.AgentRunEvent
	for ev := range ch {
		last = ev
	}
	if last.Kind != sandbox.AgentRunStatusEvent || last.Run == nil || last.Run.Status != sandbox.RunSucceeded {
		t.Fatalf("last event: got %+v, want STATUS SUCCEEDED", last)
	}
}

func TestAgentRunRejections(t *testing.T) {
	e := newAgentEnv(t)
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	stopped := e.CreateRunning(t, alice)
	if _, err := e.Svc.Stop(ctx, alice, stopped.ID); err != nil {
		t.Fatal(err)
	}
	ok := sandbox.AgentRunRequest{AgentID: "tester", Model: "m", Instruction: "go", SandboxID: sb.ID}
	for _, tc := range []struct {
		name string
		edit func(*sandbox.AgentRunRequest)
		p    func() error
		code apierror.Code
		msg  string
	}{
		{"pass_at_k", func(r *sandbox.AgentRunRequest) { r.PassAtK = 2 }, nil, apierror.InvalidArgument, "use Harbor"},
		{"harbor_only", func(r *sandbox.AgentRunRequest) { r.AgentID = "graded" }, nil, apierror.InvalidArgument, "integration: sandbox"},
		{"unknown_agent", func(r *sandbox.AgentRunRequest) { r.AgentID = "nope" }, nil, apierror.InvalidArgument, "unknown agent"},
		{"no_sandbox", func(r *sandbox.AgentRunRequest) { r.SandboxID = "" }, nil, apierror.InvalidArgument, "sandbox_id is required"},
		{"no_instruction", func(r *sandbox.AgentRunRequest) { r.Instruction = " " }, nil, apierror.InvalidArgument, "instruction"},
		{"no_model", func(r *sandbox.AgentRunRequest) { r.Model = "" }, nil, apierror.InvalidArgument, "model"},
		{"config_not_object", func(r *sandbox.AgentRunRequest) { r.Config = json.RawMessage(`[1]`) }, nil, apierror.InvalidArgument, "JSON object"},
		{"instruction_too_large", func(r *sandbox.AgentRunRequest) { r.Instruction = strings.Repeat("x", 256<<10+1) }, nil, apierror.PayloadTooLarge, "at most"},
		{"config_too_large", func(r *sandbox.AgentRunRequest) {
			r.Config = json.RawMessage(`{"a":"` + strings.Repeat("x", 64<<10) + `"}`)
		}, nil, apierror.PayloadTooLarge, "at most"},
		{"stopped", func(r *sandbox.AgentRunRequest) { r.SandboxID = stopped.ID }, nil, apierror.InvalidState, "STOPPED"},
		{"unknown_sandbox", func(r *sandbox.AgentRunRequest) { r.SandboxID = "sbx_01ARZ3NDEKTSV4RRFFQ69G5FAV" }, nil, apierror.NotFound, "not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := ok
			tc.edit(&req)
			_, err := e.Svc.StartAgentRun(ctx, alice, req)
			if apierror.CodeOf(err) != tc.code || !strings.Contains(apierror.From(err).Message, tc.msg) {
				t.Fatalf("got %v, want %s saying %q", err, tc.code, tc.msg)
			}
		})
	}
	t.Run("other_tenant", func(t *testing.T) {
		if _, err := e.Svc.StartAgentRun(ctx, bob, ok); apierror.CodeOf(err) != apierror.NotFound {
			t.Fatalf("got %v, want NOT_FOUND", err)
		}
	})
	if list, err := e.Svc.ListAgentRuns(ctx, alice, sb.ID); err != nil || len(list) != 0 {
		t.Errorf("rejected starts left runs: got %d (%v), want 0", len(list), err)
	}
}

func TestAgentRunMissingBinaryFailsAtOnce(t *testing.T) {
	e := newAgentEnv(t)
	sb := e.CreateRunning(t, alice)
	r, err := e.Svc.StartAgentRun(context.Background(), alice, sandbox.AgentRunRequest{AgentID: "missing", Instruction: "x", SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != sandbox.RunFailed || r.ExecID != "" || !strings.Contains(r.Reason, `"no-such-agent-cli" is not in the sandbox's image`) {
		t.Fatalf("got %+v, want FAILED saying the binary is missing", r)
	}
}

func TestAgentRunCancelAndTimeout(t *testing.T) {
	e := newAgentEnv(t)
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	r, err := e.Svc.StartAgentRun(ctx, alice, sandbox.AgentRunRequest{AgentID: "sleeper", Instruction: "x", SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	// A running agent is activity: the reconciler does not auto-stop its sandbox.
	if !busy(t, e, sb.ID) {
		t.Errorf("busy with a running agent: got false, want true")
	}
	got, err := e.Svc.CancelAgentRun(ctx, alice, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != sandbox.RunCancelled || got.Signal != "SIGKILL" {
		t.Fatalf("cancel: got %+v, want CANCELLED by SIGKILL", got)
	}
	if busy(t, e, sb.ID) {
		t.Errorf("busy after the cancel: got true, want false")
	}
	r, err = e.Svc.StartAgentRun(ctx, alice, sandbox.AgentRunRequest{AgentID: "slow", Instruction: "x", SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, e, r.ID); got.Status != sandbox.RunTimedOut {
		t.Fatalf("timeout: got %+v, want TIMED_OUT", got)
	}
}
