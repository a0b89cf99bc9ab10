package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/apierror"
	"sandboxd/internal/sandbox"
)

func TestExecs(t *testing.T) {
	e := newEnv(t)
	r := e.run(t, "", nil, "execs", apitest.SandboxRunning).want(t, exitOK)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !regexp.MustCompile(`^EXEC ID\s+STATE\s+EXIT\s+STARTED\s+TTY\s+COMMAND$`).MatchString(lines[0]) ||
		!regexp.MustCompile(`^`+apitest.ExecRunning+`\s+RUNNING\s+-\s+\S+\s+-\s+'sleep' '60'$`).MatchString(lines[1]) ||
		!regexp.MustCompile(`^`+apitest.ExecEnded+`\s+ENDED\s+3\s+\S+\s+-\s+'make' 'test'$`).MatchString(lines[2]) {
		t.Errorf("execs printed %q, want both execs, newest first, with state and exit", r.stdout)
	}
	r = e.run(t, "", nil, "execs", apitest.SandboxRunning, "--state", "running", "-q").want(t, exitOK)
	if r.stdout != apitest.ExecRunning+"\n" || e.ws.Last("ListExecs").ExecList.State != sandbox.ExecRunning {
		t.Errorf("execs --state running -q: got %q (the server got %+v), want the running exec alone", r.stdout, e.ws.Last("ListExecs").ExecList)
	}
	r = e.run(t, "", nil, "execs", apitest.SandboxRunning, "--limit", "1", "--all", "-o", "json").want(t, exitOK)
	var page struct {
		Execs []execJSON `json:"execs"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &page); err != nil || len(page.Execs) != 2 || page.Execs[1].ExitCode == nil || *page.Execs[1].ExitCode != 3 {
		t.Errorf("execs --all -o json: got %q (%v), want two execs of two pages", r.stdout, err)
	}
	if calls := e.ws.CallsTo("ListExecs"); len(calls) != 4 || calls[3].ExecList.After != apitest.ExecRunning {
		t.Errorf("execs --all: the server got %+v, want a second page after %s", calls, apitest.ExecRunning)
	}
	if r := e.run(t, "", nil, "execs", "sbx_other").want(t, exitServer); !strings.Contains(r.stderr, "NOT_FOUND") {
		t.Errorf("another tenant's sandbox: %q, want NOT_FOUND", r.stderr)
	}
	if r := e.run(t, "", nil, "execs", apitest.SandboxRunning, "--state", "bogus").want(t, exitServer); !strings.Contains(r.stderr, "INVALID_ARGUMENT") {
		t.Errorf("--state bogus: %q, want the server's INVALID_ARGUMENT", r.stderr)
	}
	// A command with control characters is quoted in the table.
	ex := e.ws.Execs[apitest.ExecRunning]
	ex.Command = "printf '\x1b]0;pwned\x07'"
	e.ws.Execs[apitest.ExecRunning] = ex
	if r := e.run(t, "", nil, "execs", apitest.SandboxRunning).want(t, exitOK); strings.ContainsRune(r.stdout, 0x1b) || !strings.Contains(r.stdout, `"printf '\x1b]0;pwned\a'"`) {
		t.Errorf("execs printed %q, want the command quoted", r.stdout)
	}
}

func TestSignal(t *testing.T) {
	e := newEnv(t)
	for _, tt := range []struct{ arg, want string }{{"", "SIGTERM"}, {"int", "SIGINT"}, {"SIGHUP", "SIGHUP"}, {"9", "SIGKILL"}, {"Usr1", "SIGUSR1"}} {
		args := []string{"signal", apitest.ExecRunning}
		if tt.arg != "" {
			args = append(args, tt.arg)
		}
		r := e.run(t, "", nil, args...).want(t, exitOK)
		c := e.ws.Last("SignalExec")
		if c.Signal != tt.want || c.SandboxID != apitest.SandboxRunning || c.ID != apitest.ExecRunning {
			t.Errorf("signal %q: the server got %+v, want %s to %s in %s", tt.arg, c, tt.want, apitest.ExecRunning, apitest.SandboxRunning)
		}
		if want := "sent " + tt.want + " to " + apitest.ExecRunning + " (RUNNING)\n"; r.stdout != want {
			t.Errorf("signal %q printed %q, want %q", tt.arg, r.stdout, want)
		}
	}
	for _, tt := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"signal", apitest.ExecEnded}, exitServer, "INVALID_STATE"},
		{[]string{"signal", "exec_other", "KILL"}, exitServer, "NOT_FOUND"},
		{[]string{"signal", apitest.ExecRunning, "SIGFOO"}, exitServer, "INVALID_ARGUMENT"},
		{[]string{"signal", apitest.ExecRunning, "99"}, exitUsage, "no signal numbered 99"},
		{[]string{"signal", apitest.ExecRunning, "S!G"}, exitUsage, "is no signal name"},
		{[]string{"signal"}, exitUsage, "wants 1 to 2 arguments"},
	} {
		if r := e.run(t, "", nil, tt.args...).want(t, tt.code); !strings.Contains(r.stderr, tt.msg) {
			t.Errorf("%v: got %q, want %q", tt.args, r.stderr, tt.msg)
		}
	}
	r := e.run(t, "", nil, "-o", "json", "signal", apitest.ExecRunning, "TERM").want(t, exitOK)
	var st execJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.ExecID != apitest.ExecRunning || st.State != "RUNNING" {
		t.Errorf("signal -o json: got %q (%v), want the exec's status", r.stdout, err)
	}
}

// stdinWrites are the bytes the server took through WriteStdin, and whether the last write
// closed stdin (and no other did).
func stdinWrites(e *env) ([]byte, bool) {
	var data []byte
	calls := e.ws.CallsTo("WriteStdin")
	closedLast := len(calls) > 0 && calls[len(calls)-1].Close
	for i, c := range calls {
		data = append(data, c.Data...)
		if c.Close && i != len(calls)-1 {
			closedLast = false
		}
	}
	return data, closedLast
}

// execUntilStdinClosed runs exec -i over an exec whose output holds, until the server saw
// stdin closed; then it interrupts sandboxctl (which detaches, 130).
func execUntilStdinClosed(t *testing.T, e *env, input []byte, args ...string) result {
	t.Helper()
	e.ws.ExecEvents[apitest.ExecRunning] = execEvents(sandbox.ExecResult{})[:1]
	e.ws.ExecHold = true
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for {
			if _, closed := stdinWrites(e); closed {
				cancel()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return e.runCtx(t, ctx, string(input), nil, nil, nil, args...)
}

func TestExecStdinStreams(t *testing.T) {
	e := newEnv(t)
	input := bytes.Repeat([]byte("0123456789abcdef"), 50_000) // 800 000 bytes: more than three chunks
	r := execUntilStdinClosed(t, e, input, "exec", "-i", apitest.SandboxRunning, "--", "sha256sum").want(t, exitInterrupted)
	req := e.ws.Last("Exec").Exec
	if !req.StdinOpen || len(req.Stdin) != 0 || !req.Detach {
		t.Errorf("the server got exec %+v, want stdin_open, detached, no inline stdin", req)
	}
	data, closed := stdinWrites(e)
	if !bytes.Equal(data, input) || !closed {
		t.Errorf("the server took %d bytes (closed last: %v), want the %d input bytes, then stdin closed", len(data), closed, len(input))
	}
	for _, c := range e.ws.CallsTo("WriteStdin") {
		if len(c.Data) > stdinChunk || c.ID != apitest.ExecRunning || c.SandboxID != apitest.SandboxRunning {
			t.Errorf("a write of %d bytes to %s/%s, want at most %d to %s", len(c.Data), c.SandboxID, c.ID, stdinChunk, apitest.ExecRunning)
		}
	}
	if r.stdout != "out 1\n" {
		t.Errorf("got stdout %q, want the output meanwhile", r.stdout)
	}
}

// A full stdin buffer (LIMIT_EXCEEDED with Retry-After) is waited out: the write is sent again,
// nothing lost or repeated.
func TestExecStdinWaitsForRoom(t *testing.T) {
	e := newEnv(t)
	var refused atomic.Int32
	e.cut.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/stdin") || refused.Load() >= 3 {
			return false
		}
		refused.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"error":{"code":"LIMIT_EXCEEDED","message":"the exec's stdin buffer has no room","limit_name":"stdin_buffer_bytes"}}`))
		return true
	})
	input := bytes.Repeat([]byte("x"), 300_000)
	start := time.Now()
	execUntilStdinClosed(t, e, input, "exec", "-i", apitest.SandboxRunning, "cat").want(t, exitInterrupted)
	if data, closed := stdinWrites(e); !bytes.Equal(data, input) || !closed || refused.Load() != 3 {
		t.Errorf("the server took %d bytes (closed %v) after %d refusals, want all %d, closed, after 3", len(data), closed, refused.Load(), len(input))
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("three refusals took %s, want short waits (20 ms, doubling), not Retry-After each", took)
	}
}

func TestExecStdinEnds(t *testing.T) {
	// The command ended (or closed its stdin): the input stops quietly, the exit code is its.
	e := newEnv(t)
	e.ws.ExecEvents[apitest.ExecRunning] = execEvents(sandbox.ExecResult{ExitCode: 4})
	e.ws.StdinErr = apierror.New(apierror.InvalidState, "the stdin of exec %s is not open", apitest.ExecRunning)
	r := e.run(t, "some input", nil, "exec", "-i", apitest.SandboxRunning, "head", "-c1").want(t, 4)
	if strings.Contains(r.stderr, "stdin") {
		t.Errorf("got stderr %q, want nothing about stdin", r.stderr)
	}

	// Any other refusal ends sandboxctl with the error and how to follow the command on.
	e = newEnv(t)
	e.ws.ExecEvents[apitest.ExecRunning] = execEvents(sandbox.ExecResult{})[:1]
	e.ws.ExecHold = true
	e.ws.StdinErr = apierror.New(apierror.PermissionDenied, "no input for you")
	r = e.run(t, "some input", nil, "exec", "-i", apitest.SandboxRunning, "cat").want(t, exitServer)
	if !strings.Contains(r.stderr, "follow it on: sandboxctl logs "+apitest.ExecRunning+" --follow") || !strings.Contains(r.stderr, "PERMISSION_DENIED: no input for you") {
		t.Errorf("got stderr %q, want how to follow on and the error", r.stderr)
	}

	// exec -d -i: all the input, then the id.
	e = newEnv(t)
	r = e.run(t, "all of it", nil, "exec", "-d", "-i", apitest.SandboxRunning, "cat").want(t, exitOK)
	if data, closed := stdinWrites(e); string(data) != "all of it" || !closed || r.stdout != apitest.ExecRunning+"\n" {
		t.Errorf("exec -d -i: the server took %q (closed %v), printed %q, want the input, closed, and the id", data, closed, r.stdout)
	}
}

func TestCompletionOfNewCommands(t *testing.T) {
	e := newEnv(t)
	for _, tt := range []struct {
		args []string
		want string
		not  string
	}{
		{[]string{"__complete", "signal", "exec_"}, apitest.ExecRunning + "\t" + apitest.SandboxRunning + " RUNNING 'sleep' '60'", apitest.ExecEnded + "\t"},
		{[]string{"__complete", "signal", apitest.ExecRunning, ""}, "SIGKILL", ""},
		{[]string{"__complete", "logs", ""}, apitest.ExecEnded + "\t", ""},
		{[]string{"__complete", "terminal", "--attach", ""}, apitest.ExecRunning + "\t", apitest.ExecEnded + "\t"},
		{[]string{"__complete", "execs", "--state", ""}, "ENDED", ""},
		{[]string{"__complete", "rm", "sbx"}, apitest.SandboxRunning + ":\t", ""},
		{[]string{"__complete", "watch", ""}, apitest.SandboxRunning + ":\t", ""},
		{[]string{"__complete", "update", ""}, apitest.SandboxRunning + "\t", ""},
	} {
		r := e.run(t, "", nil, tt.args...).want(t, exitOK)
		if !strings.Contains(r.stdout, tt.want) || (tt.not != "" && strings.Contains(r.stdout, tt.not)) {
			t.Errorf("%v: got %q, want %q in it (and not %q)", tt.args, r.stdout, tt.want, tt.not)
		}
	}
	if calls := e.ws.CallsTo("List"); len(calls) == 0 || calls[0].List.State != sandbox.Running {
		t.Errorf("exec completion listed %+v, want the running sandboxes", calls)
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("input/output error") }

// A local stdin that cannot be read ends exec -i as a local failure (74); the command runs on.
func TestExecStdinLocalError(t *testing.T) {
	e := newEnv(t)
	e.ws.ExecEvents[apitest.ExecRunning] = execEvents(sandbox.ExecResult{})[:1]
	e.ws.ExecHold = true
	var out, errOut bytes.Buffer
	a := &app{stdin: failingReader{}, stdout: &out, stderr: &errOut, getenv: func(k string) string {
		return map[string]string{"SANDBOX_GATEWAY_URL": e.srv.URL, "SANDBOX_API_KEY": apitest.UserKey}[k]
	}, httpClient: e.srv.Client()}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if code := run(ctx, []string{"exec", "-i", apitest.SandboxRunning, "cat"}, a); code != exitLocal {
		t.Fatalf("got exit code %d, want 74; stderr %q", code, errOut.String())
	}
	if !strings.Contains(errOut.String(), "sandboxctl: stdin: input/output error") || !strings.Contains(errOut.String(), "follow it on: sandboxctl logs "+apitest.ExecRunning) {
		t.Errorf("got stderr %q, want the stdin error and how to follow on", errOut.String())
	}
}
