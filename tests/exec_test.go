package tests

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	"sandboxd/tests/e2e"
)

// testExecOutputs checks what one exec answers: separate stdout and stderr, exit codes, a
// missing program, the output cap, stdin and binary output.
func (e *apiEnv) testExecOutputs(t *testing.T) {
	s, id := e.s, e.id
	t.Run("stdout-and-stderr-separate", func(t *testing.T) {
		res := s.Exec(t, id, `{"command":["bash","-c","echo to-stdout; echo to-stderr >&2; echo more-stdout"]}`, e2e.HdrTenant1)
		if res.Stdout != "to-stdout\nmore-stdout\n" || res.Stderr != "to-stderr\n" {
			t.Errorf("got stdout %q stderr %q, want %q and %q", res.Stdout, res.Stderr, "to-stdout\nmore-stdout\n", "to-stderr\n")
		}
		if res.ExitCode != 0 || res.StdoutTruncated || res.StderrTruncated {
			t.Errorf("got %+v, want exit 0 and nothing truncated", res)
		}
	})
	t.Run("exit-code-passes-through", func(t *testing.T) {
		res := s.Exec(t, id, `{"command":["bash","-c","exit 42"]}`, e2e.HdrTenant1)
		if res.ExitCode != 42 || res.Signal != "" || res.TimedOut || res.Error != "" {
			t.Errorf("got exit %d signal %q timed_out %v error %q, want exit 42 and nothing else",
				res.ExitCode, res.Signal, res.TimedOut, res.Error)
		}
	})
	t.Run("command-not-found", func(t *testing.T) {
		res := s.Exec(t, id, `{"command":["no-such-command-e2e","--flag"]}`, e2e.HdrTenant1)
		if res.ExitCode != 127 {
			t.Errorf("got exit %d, want 127", res.ExitCode)
		}
		if !strings.Contains(res.Error, "no-such-command-e2e") {
			t.Errorf("got error %q, want a message naming no-such-command-e2e", res.Error)
		}
	})
	t.Run("signal-reported", func(t *testing.T) {
		res := s.Exec(t, id, `{"command":["bash","-c","kill -KILL $$"]}`, e2e.HdrTenant1)
		if res.Signal != "SIGKILL" || res.TimedOut {
			t.Errorf("got signal %q timed_out %v exit %d, want SIGKILL and not timed out", res.Signal, res.TimedOut, res.ExitCode)
		}
	})
	t.Run("stdout-truncated-at-cap", func(t *testing.T) {
		// Three times the cap on stdout, a little on stderr.
		res := s.Exec(t, id, `{"command":["bash","-c","head -c 200000 /dev/zero | tr '\\0' a; echo small >&2"]}`, e2e.HdrTenant1)
		if !res.StdoutTruncated {
			t.Errorf("got stdout_truncated false with %d bytes, want true", len(res.Stdout))
		}
		if len(res.Stdout) != apiMaxOutput {
			t.Errorf("got %d stdout bytes, want the cap %d", len(res.Stdout), apiMaxOutput)
		}
		if strings.Trim(res.Stdout, "a") != "" {
			t.Errorf("got stdout with bytes other than 'a', want a prefix of the output")
		}
		if res.StderrTruncated || res.Stderr != "small\n" {
			t.Errorf("got stderr %q truncated %v, want \"small\\n\" whole", res.Stderr, res.StderrTruncated)
		}
		if res.ExitCode != 0 {
			t.Errorf("got exit %d, want 0 (the command ran to its end)", res.ExitCode)
		}
	})
	t.Run("output-at-cap-not-truncated", func(t *testing.T) {
		res := s.Exec(t, id, e2e.MustJSON(t, map[string]any{"command": []string{"head", "-c", "65536", "/dev/zero"}}), e2e.HdrTenant1)
		if res.StdoutTruncated || len(res.Stdout) != apiMaxOutput {
			t.Errorf("got %d bytes truncated %v, want %d bytes not truncated", len(res.Stdout), res.StdoutTruncated, apiMaxOutput)
		}
	})
	t.Run("stdin", func(t *testing.T) {
		res := s.Exec(t, id, `{"command":["tr","a-z","A-Z"],"stdin":"shout this\n"}`, e2e.HdrTenant1)
		if res.Stdout != "SHOUT THIS\n" {
			t.Errorf("got stdout %q, want %q", res.Stdout, "SHOUT THIS\n")
		}
		res = s.Exec(t, id, `{"command":["wc","-c"],"stdin_base64":"AAEC/w=="}`, e2e.HdrTenant1)
		if strings.TrimSpace(res.Stdout) != "4" {
			t.Errorf("got wc -c %q, want 4", res.Stdout)
		}
	})
	t.Run("binary-output", func(t *testing.T) {
		res := s.Exec(t, id, `{"command":["printf","\\377\\376ok"]}`, e2e.HdrTenant1)
		want := base64.StdEncoding.EncodeToString([]byte{0xff, 0xfe, 'o', 'k'})
		if res.StdoutBase64 != want {
			t.Errorf("got stdout_base64 %q (stdout %q), want %q", res.StdoutBase64, res.Stdout, want)
		}
	})
	t.Run("cwd-and-env", func(t *testing.T) {
		res := s.Exec(t, id, `{"command":["bash","-c","pwd; echo $GREETING"],"cwd":"/tmp","env":{"GREETING":"hi"}}`, e2e.HdrTenant1)
		if res.Stdout != "/tmp\nhi\n" {
			t.Errorf("got stdout %q, want %q", res.Stdout, "/tmp\nhi\n")
		}
	})
}

// testExecTimeout runs a command that leaves background processes, one in its own session, past
// a 2 s timeout: the answer says timed_out within a few seconds and no process is left.
func (e *apiEnv) testExecTimeout(t *testing.T) {
	s, id := e.s, e.id
	start := time.Now()
	r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/exec",
		[]byte(`{"command":["bash","-c","sleep 300 & setsid sleep 301 & sleep 302"],"timeout_sec":2}`), e2e.HdrJSON, e2e.HdrTenant1)
	took := time.Since(start)
	r.Want(t, http.StatusOK)
	var res e2e.ExecJSON
	r.Decode(t, &res)
	if !res.TimedOut {
		t.Errorf("%s: got timed_out false, want true", r)
	}
	if took < 2*time.Second || took > 10*time.Second {
		t.Errorf("got the answer after %s, want it between 2s and 10s (timeout 2s)", took.Round(time.Millisecond))
	}
	t.Logf("timed out exec answered after %s (duration_ms %d, signal %q)", took.Round(time.Millisecond), res.DurationMs, res.Signal)
	// The answer means the whole tree is gone: the very next exec sees no sleep.
	out := s.Run(t, id, []string{"ps", "-eo", "args"}, e2e.HdrTenant1)
	var left []string
	for _, line := range strings.Split(out, "\n") {
		if line = strings.TrimSpace(line); strings.HasPrefix(line, "sleep 30") || strings.HasPrefix(line, "setsid") {
			left = append(left, line)
		}
	}
	if len(left) > 0 {
		t.Errorf("ps -eo args after the timeout: got %q still running, want no sleep left; ps:\n%s", left, out)
	}
}
