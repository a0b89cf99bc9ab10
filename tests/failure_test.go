package tests

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"sandboxd/tests/e2e"
)

// TestSandboxDeath: a sandbox of the 64 MiB profile allocates 400 MiB; its gVisor sandbox dies.
// The waited exec answers 409 SANDBOX_FAILED naming the sandbox's state_reason (REST and
// GraphQL alike), the sandbox is then FAILED with that reason, the exec's stream still ends
// with an exit event carrying the error, exec on it is 409, and destroy still works.
func TestSandboxDeath(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	sb := s.Create(t, `{"profile":"tiny"}`, e2e.HdrTenant1)
	id := sb.SandboxID
	if sb.Resources.MemoryBytes != 64<<20 {
		t.Errorf("got memory_bytes %d, want 64 MiB", sb.Resources.MemoryBytes)
	}
	s.Run(t, id, []string{"true"}, e2e.HdrTenant1)
	const oom = `x=bytearray(400<<20); print(len(x))`

	var failed struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			State   string `json:"state"`
			ExecID  string `json:"exec_id"`
		} `json:"error"`
	}
	e2e.Step(t, "exec-that-kills-the-sandbox", func(t *testing.T) {
		start := time.Now()
		r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/exec",
			[]byte(`{"command":["sh","-c","echo before; sleep 1; python3 -c '`+oom+`'"],"timeout_sec":120}`), e2e.HdrJSON, e2e.HdrTenant1)
		t.Logf("%s (after %s)", r, time.Since(start).Round(time.Millisecond))
		r.WantError(t, http.StatusConflict, "SANDBOX_FAILED", "the sandbox failed")
		r.Decode(t, &failed)
		if failed.Error.State != "FAILED" || !strings.HasPrefix(failed.Error.ExecID, "exec_") {
			t.Errorf("%s: got state %q exec_id %q, want FAILED and the exec's id", r, failed.Error.State, failed.Error.ExecID)
		}
	})

	e2e.Step(t, "state-failed-with-reason", func(t *testing.T) {
		var last e2e.SandboxJSON
		e2e.Eventually(t, 30*time.Second, "GET reports FAILED", func() (bool, string) {
			last = s.Get(t, id, e2e.HdrTenant1)
			return last.State == "FAILED", e2e.MustJSON(t, last)
		})
		if last.StateReason == "" {
			t.Errorf("got %+v, want a non-empty state_reason", last)
		}
		t.Logf("state_reason: %q", last.StateReason)
		if !strings.Contains(failed.Error.Message, last.StateReason) {
			t.Errorf("the exec's error %q does not carry the state_reason %q", failed.Error.Message, last.StateReason)
		}
		var g gqlSandbox
		s.GQL(t, gqlGet, map[string]any{"id": id}, e2e.HdrTenant1).OK(t, "sandbox", &g)
		if g.State != "FAILED" || g.StateReason == nil || *g.StateReason == "" {
			t.Errorf("GraphQL sandbox: got %+v, want FAILED with a stateReason", g)
		}
	})

	e2e.Step(t, "exec-stream-ends-with-the-error", func(t *testing.T) {
		var st execStatusFull
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+failed.Error.ExecID, nil, e2e.HdrTenant1).Decode(t, &st)
		if st.State != "ENDED" || !strings.Contains(st.Error, "the sandbox failed") || st.Stdout != "before\n" {
			t.Errorf("exec status: got %+v, want ENDED with the sandbox's failure as error and the output", st)
		}
		resp := sseRequest(t, s, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+failed.Error.ExecID+"/output", "", e2e.HdrTenant1)
		evs := readSSE(t, resp.Body)
		resp.Body.Close()
		if len(evs) == 0 || evs[len(evs)-1].event != "exit" || !strings.Contains(evs[len(evs)-1].data, "the sandbox failed") {
			t.Errorf("exec output: got %v, want an exit event carrying the error last", evs)
		}
	})

	e2e.Step(t, "graphql-exec-that-kills-the-sandbox", func(t *testing.T) {
		other := s.Create(t, `{"profile":"tiny"}`, e2e.HdrTenant1).SandboxID
		s.Run(t, other, []string{"true"}, e2e.HdrTenant1)
		g := s.GQL(t, gqlExec, map[string]any{"id": other, "in": map[string]any{"command": []string{"python3", "-c", oom}, "timeoutSec": 120}}, e2e.HdrTenant1)
		g.WantCode(t, 0, "SANDBOX_FAILED", "the sandbox failed")
		e2e.Eventually(t, 30*time.Second, "GET reports FAILED", func() (bool, string) {
			last := s.Get(t, other, e2e.HdrTenant1)
			return last.State == "FAILED", e2e.MustJSON(t, last)
		})
	})

	e2e.Step(t, "exec-on-failed-is-409", func(t *testing.T) {
		r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/exec", []byte(`{"command":["true"]}`), e2e.HdrJSON, e2e.HdrTenant1)
		r.WantError(t, http.StatusConflict, "INVALID_STATE", "FAILED")
		r = s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/files?path=x", nil, e2e.HdrTenant1)
		r.WantError(t, http.StatusConflict, "INVALID_STATE")
	})

	e2e.Step(t, "destroy", func(t *testing.T) {
		r := s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+id, nil, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id, nil, e2e.HdrTenant1).WantError(t, http.StatusNotFound, "NOT_FOUND")
	})
}

// TestInitOutlivesSignalsFromItsBox: a command sends the box's PID 1 the signals that used to
// end it or stop it (`kill 1`, a container's `kill -HUP 1` for "reload", the crash signals a
// process can send, the terminal stop signals), each several times. The sandbox stays RUNNING,
// answers the next command, and a command that ran across the signals runs on undisturbed.
func TestInitOutlivesSignalsFromItsBox(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	id := s.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant1).SandboxID
	bg := detach(t, s, id, `{"command":["sh","-c","i=0; while [ $i -lt 600 ]; do i=$((i+1)); echo tick $i; sleep 0.1; done"],"wait":false}`, e2e.HdrTenant1)

	// By number (a shell's kill knows not every name): TERM INT HUP QUIT ILL TRAP ABRT BUS FPE
	// SEGV STKFLT SYS TSTP TTIN TTOU USR1 USR2 ALRM PIPE.
	const sigs = "15 2 1 3 4 5 6 7 8 11 16 31 20 21 22 10 12 14 13"
	res := s.Exec(t, id, `{"command":["sh","-c","for r in 1 2 3; do for s in `+sigs+`; do kill -$s 1 || echo refused $s; done; done; sleep 0.5; echo sent"]}`, e2e.HdrTenant1)
	if res.ExitCode != 0 || res.Stdout != "sent\n" {
		t.Fatalf("sending PID 1 the signals: %+v", res)
	}
	if got := s.Get(t, id, e2e.HdrTenant1); got.State != "RUNNING" {
		t.Fatalf("after the signals: state %s (%s), want RUNNING", got.State, got.StateReason)
	}
	if res := s.Exec(t, id, `{"command":["echo","still here"]}`, e2e.HdrTenant1); res.Stdout != "still here\n" {
		t.Fatalf("the command after the signals: %+v", res)
	}
	var st execStatusFull
	before := 0
	e2e.Eventually(t, 10*time.Second, "the command started before the signals goes on", func() (bool, string) {
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+bg.ExecID, nil, e2e.HdrTenant1).Decode(t, &st)
		n := strings.Count(st.Stdout, "tick ")
		if before == 0 {
			before = n
			return false, st.State
		}
		return st.State == "RUNNING" && n > before+5, st.State + " " + strconv.Itoa(n)
	})
}
