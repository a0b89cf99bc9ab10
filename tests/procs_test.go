package tests

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

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
func countProcs(t *testing.T, s *e2e.Server, id string, want []string) (int, string) {
	t.Helper()
	out := s.Run(t, id, []string{"ps", "-eo", "args"}, e2e.HdrTenant1)
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
func waitProcs(t *testing.T, s *e2e.Server, id string, want []string, n int) {
	t.Helper()
	e2e.Eventually(t, 30*time.Second, "processes "+strings.Join(want, ", "), func() (bool, string) {
		got, ps := countProcs(t, s, id, want)
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

	e2e.Step(t, "timeout-ends-escaped-processes", func(t *testing.T) {
		id := s.Create(t, `{}`, e2e.HdrTenant1).SandboxID
		body, err := json.Marshal(map[string]any{"command": []string{"bash", "-c", escapeScript}, "timeout_sec": 3})
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			r   *e2e.Response
			err error
		}
		done := make(chan result, 1)
		go func() {
			r, err := s.Send(http.MethodPost, e2e.Prefix+"/"+id+"/exec", bytes.NewReader(body), e2e.HdrJSON, e2e.HdrTenant1)
			done <- result{r, err}
		}()
		// Every escapee runs before the timeout fires.
		waitProcs(t, s, id, escapees, len(escapees))
		res := <-done
		if res.err != nil {
			t.Fatal(res.err)
		}
		res.r.Want(t, http.StatusOK)
		var ex e2e.ExecJSON
		res.r.Decode(t, &ex)
		if !ex.TimedOut {
			t.Errorf("%s: got timed_out false, want true", res.r)
		}
		if n, ps := countProcs(t, s, id, escapees); n != 0 {
			t.Errorf("after the timeout: got %d of %q still running, want 0; ps -eo args:\n%s", n, escapees, ps)
		}
	})

	e2e.Step(t, "cancel-ends-escaped-processes", func(t *testing.T) {
		id := s.Create(t, `{}`, e2e.HdrTenant1).SandboxID
		run := startRun(t, s, e2e.MustJSON(t, map[string]any{"agent_id": "escaper", "instruction": "escape", "sandbox_id": id}), e2e.HdrTenant1)
		if run.Status != "RUNNING" {
			t.Fatalf("start: got %+v, want RUNNING", run)
		}
		waitProcs(t, s, id, escapees, len(escapees))
		r := s.Curl(t, http.MethodPost, agentRuns+"/"+run.RunID+"/cancel", nil, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
		r.Decode(t, &run)
		if run.Status != "CANCELLED" {
			t.Fatalf("cancel: got %+v, want CANCELLED", run)
		}
		if n, ps := countProcs(t, s, id, escapees); n != 0 {
			t.Errorf("after the cancel: got %d of %q still running, want 0; ps -eo args:\n%s", n, escapees, ps)
		}
	})

	e2e.Step(t, "normal-exit-leaves-background-running", func(t *testing.T) {
		id := s.Create(t, `{}`, e2e.HdrTenant1).SandboxID
		ex := s.Exec(t, id, e2e.MustJSON(t, map[string]any{"command": []string{"bash", "-c", "sleep 1003 & (setsid sleep 1004 &); echo started"}, "timeout_sec": 30}), e2e.HdrTenant1)
		if ex.ExitCode != 0 || ex.TimedOut || ex.Stdout != "started\n" {
			t.Fatalf("got %+v, want exit 0 and started", ex)
		}
		time.Sleep(time.Second)
		if n, ps := countProcs(t, s, id, []string{"sleep 1003"}); n != 1 {
			t.Errorf("after the exit: got %d of sleep 1003, want 1 (a server started with & must survive); ps -eo args:\n%s", n, ps)
		}
		if n, ps := countProcs(t, s, id, []string{"sleep 1004"}); n != 1 {
			t.Errorf("after the exit: got %d of sleep 1004, want 1; ps -eo args:\n%s", n, ps)
		}
		// No public API signals an ended exec (an ended agent run cannot be cancelled); the
		// guest's signal of an ended exec is tested in the conformance suite (SignalAfterExit).
	})
}
