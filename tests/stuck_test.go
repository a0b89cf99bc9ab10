package tests

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"sandboxd/tests/e2e"
)

// TestStuckSandbox: a command stops its sandbox's PID 1 (`kill -STOP 1`: nothing can catch
// SIGSTOP, and gVisor lets a box's root signal its init). No caller is held by the stuck box:
//   - a waited exec already running answers 503 UNAVAILABLE with its exec_id once its timeout
//     and 30 s more passed without its end reported;
//   - an exec started meanwhile answers 503 UNAVAILABLE with its exec_id after the 30 s bound on
//     the start's answer ("it may still start");
//   - while that start is unanswered, the next exec fails at once (the sandbox looks stuck);
//   - the server serves other calls meanwhile.
//
// Once PID 1 goes on (SIGCONT from outside; stop and destroy would do too) nothing is lost: the
// exec started while it was stopped runs, a subscriber that opened its output before gets
// every byte and the exit, the other exec ends, and the next exec runs as usual.
func TestStuckSandbox(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	id := s.Create(t, `{}`, e2e.HdrTenant1).SandboxID
	for range 3 { // the later ones go over a kept exec stream
		s.Run(t, id, []string{"true"}, e2e.HdrTenant1)
	}
	stopped := false
	defer func() {
		if stopped {
			e2e.Runsc(t, s.State.Dir, "kill", id, "CONT")
		}
	}()

	type answer struct {
		r    *e2e.Response
		err  error
		took time.Duration
	}
	exec := func(body string) <-chan answer {
		ch := make(chan answer, 1)
		go func() {
			start := time.Now()
			r, err := s.Send(http.MethodPost, e2e.Prefix+"/"+id+"/exec", strings.NewReader(body), e2e.HdrJSON, e2e.HdrTenant1)
			ch <- answer{r, err, time.Since(start)}
		}()
		return ch
	}
	wait := func(t *testing.T, ch <-chan answer) answer {
		t.Helper()
		select {
		case a := <-ch:
			if a.err != nil {
				t.Fatal(a.err)
			}
			t.Logf("%s (after %s)", a.r, a.took.Round(time.Millisecond))
			return a
		case <-time.After(120 * time.Second):
			t.Fatalf("no answer to an exec within 120 s")
		}
		return answer{}
	}
	type apiError struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			ExecID  string `json:"exec_id"`
		} `json:"error"`
	}
	var running, unanswered apiError
	e2e.Step(t, "a-command-stops-pid-1", func(t *testing.T) {
		// It still runs when PID 1 stops (1.5 s in), with seconds of margin on a slow machine.
		runningAns := exec(`{"command":["sh","-c","sleep 4; echo a-done"],"timeout_sec":5}`)
		time.Sleep(500 * time.Millisecond)
		r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/exec",
			[]byte(`{"command":["sh","-c","sleep 1; kill -STOP 1"],"wait":false}`), e2e.HdrJSON, e2e.HdrTenant1)
		r.Want(t, http.StatusAccepted)
		stopped = true
		time.Sleep(3 * time.Second)
		unansweredAns := exec(`{"command":["sh","-c","echo one; sleep 1; echo two"]}`)

		// The server is not held by the stuck sandbox meanwhile.
		time.Sleep(2 * time.Second)
		t0 := time.Now()
		if got := s.Get(t, id, e2e.HdrTenant1); got.State != "RUNNING" {
			t.Errorf("got state %s, want RUNNING", got.State)
		}
		if d := time.Since(t0); d > 5*time.Second {
			t.Errorf("a GET of the sandbox took %v while its execs waited", d)
		}

		a := wait(t, unansweredAns)
		a.r.WantError(t, http.StatusServiceUnavailable, "UNAVAILABLE", "did not answer the start", "may still start")
		a.r.Decode(t, &unanswered)
		if !strings.HasPrefix(unanswered.Error.ExecID, "exec_") || a.took < 29*time.Second || a.took > 60*time.Second {
			t.Errorf("got exec_id %q after %v, want the exec's id after the 30 s bound", unanswered.Error.ExecID, a.took)
		}
		// While that start is unanswered, the next fails at once: a stuck sandbox gathers no
		// waiting requests and followers.
		t0 = time.Now()
		r = s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/exec", []byte(`{"command":["true"]}`), e2e.HdrJSON, e2e.HdrTenant1)
		r.WantError(t, http.StatusServiceUnavailable, "UNAVAILABLE", "looks stuck", unanswered.Error.ExecID)
		if d := time.Since(t0); d > 5*time.Second || r.Header.Get("Retry-After") == "" {
			t.Errorf("%s: answered after %v with Retry-After %q, want at once with a Retry-After", r, d, r.Header.Get("Retry-After"))
		}
		a = wait(t, runningAns)
		a.r.WantError(t, http.StatusServiceUnavailable, "UNAVAILABLE", "did not report the end", "timeout (5s)")
		a.r.Decode(t, &running)
		if !strings.HasPrefix(running.Error.ExecID, "exec_") || a.took < 34*time.Second || a.took > 60*time.Second {
			t.Errorf("got exec_id %q after %v, want the exec's id after its timeout and 30 s", running.Error.ExecID, a.took)
		}
	})

	e2e.Step(t, "nothing-lost-once-pid-1-goes-on", func(t *testing.T) {
		execPath := e2e.Prefix + "/" + id + "/execs/" + unanswered.Error.ExecID
		var st execStatusFull
		s.Curl(t, http.MethodGet, execPath, nil, e2e.HdrTenant1).Decode(t, &st)
		if st.State != "RUNNING" {
			t.Errorf("exec status while the sandbox is stuck: got %+v, want RUNNING (it may still start)", st)
		}
		resp := sseRequest(t, s, http.MethodGet, execPath+"/output", "", e2e.HdrTenant1)
		defer resp.Body.Close()
		e2e.Runsc(t, s.State.Dir, "kill", id, "CONT")
		stopped = false
		evs := readSSE(t, resp.Body)
		var out strings.Builder
		for _, ev := range evs[:max(len(evs)-1, 0)] {
			if ev.event != "chunk" {
				t.Errorf("got event %q before the exit, want only chunks", ev.event)
			}
			out.WriteString(ev.data)
		}
		if len(evs) == 0 || evs[len(evs)-1].event != "exit" || !strings.Contains(evs[len(evs)-1].data, `"exit_code":0`) {
			t.Fatalf("output: got %v, want the chunks and an exit of 0 last", evs)
		}
		if got := out.String(); !strings.Contains(got, `"one\n"`) || !strings.Contains(got, `"two\n"`) {
			t.Errorf("output chunks: got %s, want one and two", got)
		}
		s.Curl(t, http.MethodGet, execPath, nil, e2e.HdrTenant1).Decode(t, &st)
		if st.State != "ENDED" || st.ExitCode == nil || *st.ExitCode != 0 || st.Stdout != "one\ntwo\n" || st.Error != "" {
			t.Errorf("exec status: got %+v, want ENDED, exit 0, the whole stdout, no error", st)
		}
		// The exec that ran across the stop ends too (at its end or its timeout: both came
		// due while PID 1 was stopped).
		e2e.Eventually(t, 30*time.Second, "the running exec ends", func() (bool, string) {
			var st execStatusFull
			r := s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+running.Error.ExecID, nil, e2e.HdrTenant1)
			r.Decode(t, &st)
			return st.State == "ENDED", r.String()
		})
	})

	e2e.Step(t, "next-exec-runs", func(t *testing.T) {
		if got := s.Run(t, id, []string{"echo", "after"}, e2e.HdrTenant1); got != "after\n" {
			t.Errorf("got %q, want after", got)
		}
	})
}
