package sandbox

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/apierror"
)

// testAgents is the catalog of the agent tests: "tester" is a shell script that reads its
// instruction and config (paths relative to the workspace, where it runs: the fake driver's
// guest runs on the host) and writes a file into the workspace, then lingers a second so that
// the start's answer reliably sees it RUNNING.
func testAgents() []AgentConfig {
	return []AgentConfig{
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

func newAgentEnv(t *testing.T) *env {
	return newEnvWith(t, envOptions{
		config: func(c *Config) { c.Agents = testAgents() },
	})
}

// waitRun polls a run until it is final.
func waitRun(t *testing.T, e *env, id string) AgentRun {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := e.svc.GetAgentRun(context.Background(), alice, id)
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
	sb := createRunning(t, e, alice)
	r, err := e.svc.StartAgentRun(ctx, alice, AgentRunRequest{AgentID: "tester", Model: "m/x", Instruction: "fix it",
		SandboxID: sb.ID, Config: json.RawMessage(`{"k":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != RunRunning || r.ExecID == "" || r.SandboxID != sb.ID || r.RunDir != AgentRunsDir+"/"+r.ID {
		t.Fatalf("start: got %+v, want RUNNING with an exec", r)
	}
	got := waitRun(t, e, r.ID)
	if got.Status != RunSucceeded || got.ExitCode != 0 || got.EndedAt.IsZero() {
		t.Fatalf("end: got %+v, want SUCCEEDED", got)
	}
	for path, want := range map[string]string{"result.txt": "fix it", "config-seen.json": `{"k":1}`,
		r.RunDir + "/instruction.md": "fix it"} {
		b, _, err := e.svc.ReadFile(ctx, alice, sb.ID, path, 1<<20)
		if err != nil || string(b) != want {
			t.Errorf("%s: got %q (%v), want %q", path, b, err, want)
		}
	}
	out, err := e.svc.GetExec(ctx, alice, sb.ID, got.ExecID, true)
	if err != nil || string(out.Stdout) != "model m/x\n" {
		t.Errorf("agent output: got %q (%v), want %q", out.Stdout, err, "model m/x\n")
	}
	// The sandbox stays RUNNING and usable.
	if sb2, err := e.svc.Get(ctx, alice, sb.ID); err != nil || sb2.State != Running {
		t.Errorf("sandbox after the run: got %v (%v), want RUNNING", sb2.State, err)
	}
	if res := mustExec(t, e, alice, sb.ID, "cat", "result.txt"); string(res.Stdout) != "fix it" {
		t.Errorf("later exec: got %q, want %q", res.Stdout, "fix it")
	}
	// Listing: newest first; another tenant sees nothing.
	r2, err := e.svc.StartAgentRun(ctx, alice, AgentRunRequest{AgentID: "failing", Instruction: "x", SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	if f := waitRun(t, e, r2.ID); f.Status != RunFailed || f.ExitCode != 3 || !strings.Contains(f.Reason, "code 3") {
		t.Errorf("failing agent: got %+v, want FAILED with exit 3", f)
	}
	list, err := e.svc.ListAgentRuns(ctx, alice, sb.ID)
	if err != nil || len(list) != 2 || list[0].ID != r2.ID || list[1].ID != r.ID {
		t.Fatalf("list: got %d runs (%v), want [%s %s]", len(list), err, r2.ID, r.ID)
	}
	if _, err := e.svc.GetAgentRun(ctx, bob, r.ID); apierror.CodeOf(err) != apierror.NotFound {
		t.Errorf("other tenant get: got %v, want NOT_FOUND", err)
	}
	if _, err := e.svc.CancelAgentRun(ctx, bob, r.ID); apierror.CodeOf(err) != apierror.NotFound {
		t.Errorf("other tenant cancel: got %v, want NOT_FOUND", err)
	}
	if _, err := e.svc.ListAgentRuns(ctx, bob, sb.ID); apierror.CodeOf(err) != apierror.NotFound {
		t.Errorf("other tenant list: got %v, want NOT_FOUND", err)
	}
	if _, err := e.svc.CancelAgentRun(ctx, alice, r.ID); apierror.CodeOf(err) != apierror.InvalidState {
		t.Errorf("cancel of a finished run: got %v, want INVALID_STATE", err)
	}
	// The event stream: status, output, final status, from any replica.
	ch, err := e.replica(t).AgentRunEvents(ctx, alice, r.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	var kinds []AgentRunEventKind
	var text string
	for ev := range ch {
		kinds = append(kinds, ev.Kind)
		text += string(ev.Data)
	}
	if len(kinds) < 2 || kinds[0] != AgentRunStatusEvent || kinds[len(kinds)-1] == AgentRunStatusEvent || text != "model m/x\n" {
		t.Errorf("events of a finished run: got %v with %q, want STATUS then CHUNKs", kinds, text)
	}
}

func TestAgentRunEventsFollowALiveRun(t *testing.T) {
	e := newAgentEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sb := createRunning(t, e, alice)
	r, err := e.svc.StartAgentRun(ctx, alice, AgentRunRequest{AgentID: "tester", Model: "m", Instruction: "go", SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := e.svc.AgentRunEvents(ctx, alice, r.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	var last AgentRunEvent
	for ev := range ch {
		last = ev
	}
	if last.Kind != AgentRunStatusEvent || last.Run == nil || last.Run.Status != RunSucceeded {
		t.Fatalf("last event: got %+v, want STATUS SUCCEEDED", last)
	}
}

func TestAgentRunRejections(t *testing.T) {
	e := newAgentEnv(t)
	ctx := context.Background()
	sb := createRunning(t, e, alice)
	stopped := createRunning(t, e, alice)
	if _, err := e.svc.Stop(ctx, alice, stopped.ID); err != nil {
		t.Fatal(err)
	}
	ok := AgentRunRequest{AgentID: "tester", Model: "m", Instruction: "go", SandboxID: sb.ID}
	for _, tc := range []struct {
		name string
		edit func(*AgentRunRequest)
		p    func() error
		code apierror.Code
		msg  string
	}{
		{"pass_at_k", func(r *AgentRunRequest) { r.PassAtK = 2 }, nil, apierror.InvalidArgument, "use Harbor"},
		{"harbor_only", func(r *AgentRunRequest) { r.AgentID = "graded" }, nil, apierror.InvalidArgument, "integration: sandbox"},
		{"unknown_agent", func(r *AgentRunRequest) { r.AgentID = "nope" }, nil, apierror.InvalidArgument, "unknown agent"},
		{"no_sandbox", func(r *AgentRunRequest) { r.SandboxID = "" }, nil, apierror.InvalidArgument, "sandbox_id is required"},
		{"no_instruction", func(r *AgentRunRequest) { r.Instruction = " " }, nil, apierror.InvalidArgument, "instruction"},
		{"no_model", func(r *AgentRunRequest) { r.Model = "" }, nil, apierror.InvalidArgument, "model"},
		{"config_not_object", func(r *AgentRunRequest) { r.Config = json.RawMessage(`[1]`) }, nil, apierror.InvalidArgument, "JSON object"},
		{"instruction_too_large", func(r *AgentRunRequest) { r.Instruction = strings.Repeat("x", 256<<10+1) }, nil, apierror.PayloadTooLarge, "at most"},
		{"config_too_large", func(r *AgentRunRequest) { r.Config = json.RawMessage(`{"a":"` + strings.Repeat("x", 64<<10) + `"}`) }, nil, apierror.PayloadTooLarge, "at most"},
		{"stopped", func(r *AgentRunRequest) { r.SandboxID = stopped.ID }, nil, apierror.InvalidState, "STOPPED"},
		{"unknown_sandbox", func(r *AgentRunRequest) { r.SandboxID = "sbx_01ARZ3NDEKTSV4RRFFQ69G5FAV" }, nil, apierror.NotFound, "not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := ok
			tc.edit(&req)
			_, err := e.svc.StartAgentRun(ctx, alice, req)
			if apierror.CodeOf(err) != tc.code || !strings.Contains(apierror.From(err).Message, tc.msg) {
				t.Fatalf("got %v, want %s saying %q", err, tc.code, tc.msg)
			}
		})
	}
	t.Run("other_tenant", func(t *testing.T) {
		if _, err := e.svc.StartAgentRun(ctx, bob, ok); apierror.CodeOf(err) != apierror.NotFound {
			t.Fatalf("got %v, want NOT_FOUND", err)
		}
	})
	if list, err := e.svc.ListAgentRuns(ctx, alice, sb.ID); err != nil || len(list) != 0 {
		t.Errorf("rejected starts left runs: got %d (%v), want 0", len(list), err)
	}
}

func TestAgentRunMissingBinaryFailsAtOnce(t *testing.T) {
	e := newAgentEnv(t)
	sb := createRunning(t, e, alice)
	r, err := e.svc.StartAgentRun(context.Background(), alice, AgentRunRequest{AgentID: "missing", Instruction: "x", SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != RunFailed || r.ExecID != "" || !strings.Contains(r.Reason, `"no-such-agent-cli" is not in the sandbox's image`) {
		t.Fatalf("got %+v, want FAILED saying the binary is missing", r)
	}
}

func TestAgentRunCancelAndTimeout(t *testing.T) {
	e := newAgentEnv(t)
	ctx := context.Background()
	sb := createRunning(t, e, alice)
	r, err := e.svc.StartAgentRun(ctx, alice, AgentRunRequest{AgentID: "sleeper", Instruction: "x", SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	// A running agent is activity: the reconciler does not auto-stop its sandbox.
	if !e.svc.busy(ctx, sb.ID) {
		t.Errorf("busy with a running agent: got false, want true")
	}
	got, err := e.svc.CancelAgentRun(ctx, alice, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != RunCancelled || got.Signal != "SIGKILL" {
		t.Fatalf("cancel: got %+v, want CANCELLED by SIGKILL", got)
	}
	if e.svc.busy(ctx, sb.ID) {
		t.Errorf("busy after the cancel: got true, want false")
	}
	r, err = e.svc.StartAgentRun(ctx, alice, AgentRunRequest{AgentID: "slow", Instruction: "x", SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, e, r.ID); got.Status != RunTimedOut {
		t.Fatalf("timeout: got %+v, want TIMED_OUT", got)
	}
}

func TestRunStatus(t *testing.T) {
	ended := func(code int, sig string, timedOut bool, errText string) *ExecResult {
		return &ExecResult{State: ExecEnded, ExitCode: code, Signal: sig, TimedOut: timedOut, Error: errText}
	}
	running := &ExecResult{State: ExecRunning}
	for _, tc := range []struct {
		name                          string
		started, cancelled, gone, old bool
		ex                            *ExecResult
		want                          AgentRunStatus
	}{
		{"queued", false, false, false, false, nil, RunQueued},
		{"queued_abandoned", false, false, false, true, nil, RunFailed},
		{"cancelled_before_start", false, true, false, false, nil, RunCancelled},
		{"running", true, false, false, false, running, RunRunning},
		{"cancel_pending", true, true, false, false, running, RunRunning},
		{"succeeded", true, false, false, false, ended(0, "", false, ""), RunSucceeded},
		{"failed", true, false, false, false, ended(1, "", false, ""), RunFailed},
		{"not_found", true, false, false, false, ended(127, "", false, ""), RunFailed},
		{"killed", true, false, false, false, ended(-1, "SIGKILL", false, ""), RunFailed},
		{"cancelled", true, true, false, false, ended(-1, "SIGKILL", false, ""), RunCancelled},
		{"timed_out", true, false, false, false, ended(-1, "SIGKILL", true, ""), RunTimedOut},
		{"lost", true, false, false, false, ended(-1, "", false, "the sandbox was stopped"), RunFailed},
		{"exec_gone", true, false, true, false, nil, RunFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, reason := runStatus(tc.started, tc.cancelled, tc.ex, tc.gone, tc.old)
			if got != tc.want {
				t.Fatalf("got %s (%q), want %s", got, reason, tc.want)
			}
			if got == RunFailed && reason == "" {
				t.Fatalf("FAILED without a reason")
			}
		})
	}
}

func TestAgentCatalogValidation(t *testing.T) {
	good := func() AgentConfig {
		return AgentConfig{ID: "a", Integrations: []string{"sandbox"}, Binary: "a", Command: []string{"a", "{{model}}"}}
	}
	for _, tc := range []struct {
		name string
		edit func(*AgentConfig)
		want string // "" = valid
	}{
		{"valid", func(*AgentConfig) {}, ""},
		{"bad_id", func(a *AgentConfig) { a.ID = "A B" }, "id must match"},
		{"no_integrations", func(a *AgentConfig) { a.Integrations = nil }, "no integrations"},
		{"no_binary", func(a *AgentConfig) { a.Binary = "" }, "binary"},
		{"binary_with_quote", func(a *AgentConfig) { a.Binary = `a"b` }, "binary"},
		{"no_command", func(a *AgentConfig) { a.Command = nil }, "no command"},
		{"unknown_placeholder", func(a *AgentConfig) { a.Command = []string{"a", "{{modle}}"} }, "unknown placeholder {{modle}}"},
		{"timeout_too_long", func(a *AgentConfig) { a.TimeoutSec = 1 << 40 }, "timeout_sec"},
		{"reserved_env", func(a *AgentConfig) { a.Env = map[string]string{"SBX_EXEC_ID": "x"} }, "env name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := good()
			tc.edit(&a)
			l := DefaultLimits()
			agents := []AgentConfig{a}
			err := validateAgents(agents, &l)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("got %v, want valid", err)
			case tc.want == "" && agents[0].TimeoutSec != l.ExecTimeoutDefaultSec:
				t.Fatalf("default timeout: got %d, want %d", agents[0].TimeoutSec, l.ExecTimeoutDefaultSec)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
	l := DefaultLimits()
	if err := validateAgents([]AgentConfig{good(), good()}, &l); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate: got %v, want an error saying twice", err)
	}
}
