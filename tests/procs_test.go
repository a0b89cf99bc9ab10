package tests

import (
	"context"
	"strings"
	"testing"
	"time"

	"sandboxd/client"
	"sandboxd/tests/e2e"
)

// escapeScript is the attack of issue 13 ("processes outlive their exec"): processes that
// leave the exec's session and process group, drop its environment (env -i drops
// SBX_EXEC_ID), fork twice so they are re-parented to PID 1, and rename themselves. (The
// issue's `sh -c 'exec -a …'` is bash here: the image's sh is dash, whose exec has no -a.)
const escapeScript = `setsid env -i sleep 1000 & (setsid env -i sleep 1001 &); nohup bash -c 'exec -a x sleep 1002' >/dev/null 2>&1 & sleep 60`

// escapees are the escaped processes as `ps -eo args` shows them.
var escapees = []string{"sleep 1000", "sleep 1001", "x 1002"}

// countProcs runs `ps -eo args` in a new exec of the sandbox and counts the lines that are
// exactly one of want.
func countProcs(ctx context.Context, t *testing.T, c *client.Client, id string, want []string) (int, string) {
	t.Helper()
	out := runVia(ctx, t, c, id, []string{"ps", "-eo", "args"})
	n := 0
	for _, line := range strings.Split(out, "\n") {
		for _, w := range want {
			if strings.TrimSpace(line) == w {
				n++
			}
		}
	}
	return n, out
}

// waitProcs waits until countProcs finds n.
func waitProcs(ctx context.Context, t *testing.T, c *client.Client, id string, want []string, n int) {
	t.Helper()
	e2e.Eventually(t, 30*time.Second, "processes "+strings.Join(want, ", "), func() (bool, string) {
		got, ps := countProcs(ctx, t, c, id, want)
		return got == n, ps
	})
}

// TestProcessesEndWithTheirExec: whatever an exec's processes do to their session, process
// group or environment, they end with its timeout and with an agent run's cancel; what a
// command starts in the background survives its normal exit.
func TestProcessesEndWithTheirExec(t *testing.T) {
	agents := []map[string]any{
		{"id": "escaper", "integrations": []string{"sandbox"}, "binary": "bash",
			"command": []string{"bash", "-c", escapeScript}},
	}
	s := e2e.StartServer(t, e2e.ServerOptions{Extra: map[string]any{"agents": agents}})
	ctx, c := t.Context(), s.Client(client.WithAPIKey(e2e.KeyTenant1))

	e2e.Step(t, "timeout-ends-escaped-processes", func(t *testing.T) {
		id := newSandbox(ctx, t, s, c, client.CreateRequest{}, e2e.HdrTenant1).ID
		type result struct {
			ex  client.Exec
			err error
		}
		done := make(chan result, 1)
		go func() {
			ex, err := c.Exec(ctx, id, client.ExecRequest{Command: []string{"bash", "-c", escapeScript}, TimeoutSec: client.Ptr[int64](3)})
			done <- result{ex, err}
		}()
		// Every escapee runs before the timeout fires.
		waitProcs(ctx, t, c, id, escapees, len(escapees))
		res := <-done
		if res.err != nil {
			t.Fatal(res.err)
		}
		if !res.ex.TimedOut {
			t.Errorf("got %+v: timed_out false, want true", res.ex)
		}
		if n, ps := countProcs(ctx, t, c, id, escapees); n != 0 {
			t.Errorf("after the timeout: got %d of %q still running, want 0; ps -eo args:\n%s", n, escapees, ps)
		}
	})

	e2e.Step(t, "cancel-ends-escaped-processes", func(t *testing.T) {
		id := newSandbox(ctx, t, s, c, client.CreateRequest{}, e2e.HdrTenant1).ID
		run, err := c.StartAgentRun(ctx, client.AgentRunRequest{AgentID: "escaper", Instruction: "escape", SandboxID: id})
		if err != nil || run.Status != client.RunRunning {
			t.Fatalf("start: got %+v (%v), want RUNNING", run, err)
		}
		waitProcs(ctx, t, c, id, escapees, len(escapees))
		run, err = c.CancelAgentRun(ctx, run.ID)
		if err != nil || run.Status != client.RunCancelled {
			t.Fatalf("cancel: got %+v (%v), want CANCELLED", run, err)
		}
		if n, ps := countProcs(ctx, t, c, id, escapees); n != 0 {
			t.Errorf("after the cancel: got %d of %q still running, want 0; ps -eo args:\n%s", n, escapees, ps)
		}
	})

	e2e.Step(t, "normal-exit-leaves-background-running", func(t *testing.T) {
		id := newSandbox(ctx, t, s, c, client.CreateRequest{}, e2e.HdrTenant1).ID
		ex, err := c.Exec(ctx, id, client.ExecRequest{Command: []string{"bash", "-c", "sleep 1003 & (setsid sleep 1004 &); echo started"}, TimeoutSec: client.Ptr[int64](30)})
		if err != nil || ex.ExitCode != 0 || ex.TimedOut || ex.Stdout != "started\n" {
			t.Fatalf("got %+v (%v), want exit 0 and started", ex, err)
		}
		time.Sleep(time.Second)
		if n, ps := countProcs(ctx, t, c, id, []string{"sleep 1003"}); n != 1 {
			t.Errorf("after the exit: got %d of sleep 1003, want 1 (a server started with & must survive); ps -eo args:\n%s", n, ps)
		}
		if n, ps := countProcs(ctx, t, c, id, []string{"sleep 1004"}); n != 1 {
			t.Errorf("after the exit: got %d of sleep 1004, want 1; ps -eo args:\n%s", n, ps)
		}
		// No public API signals an ended exec (an ended agent run cannot be cancelled); the
		// guest's signal of an ended exec is tested in the conformance suite (SignalAfterExit).
	})
}
