package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/sandbox"
)

// ttyEvents are a terminal's output: escape sequences and all, then its exit.
func ttyEvents(exitCode int) []sandbox.ExecEvent {
	exit := sandbox.ExecResult{ExecID: apitest.ExecRunning, SandboxID: apitest.SandboxRunning, State: sandbox.ExecEnded, ExitCode: exitCode}
	return []sandbox.ExecEvent{
		{Kind: sandbox.ExecChunk, Cursor: "1-0", Stream: "stdout", Data: []byte("$ \x1b]0;title\x07\x1b[31mred\x1b[0m\r\n")},
		{Kind: sandbox.ExecChunk, Cursor: "2-0", Stream: "stdout", Data: []byte("bye\r\n")},
		{Kind: sandbox.ExecExit, Cursor: "3-0", Result: &exit},
	}
}

func TestTerminal(t *testing.T) {
	e := newEnv(t)
	e.ws.ExecEvents[apitest.ExecRunning] = ttyEvents(5)
	r := e.run(t, "", nil, "terminal", apitest.SandboxRunning, "--", "bash", "-i").want(t, 5)
	req := e.ws.Last("Exec").Exec
	if !slices.Equal(req.Command, []string{"bash", "-i"}) || req.Tty == nil || *req.Tty != (sandbox.TtySize{Rows: 24, Cols: 80}) ||
		req.Env["TERM"] != "xterm-256color" || req.TimeoutSec == nil || *req.TimeoutSec != terminalTimeoutSec || !req.Detach {
		t.Errorf("the server got exec %+v, want bash -i detached under a 24x80 terminal, TERM and a day's timeout", req)
	}
	// In terminal mode the sandbox's bytes reach the terminal as they are.
	if want := "$ \x1b]0;title\x07\x1b[31mred\x1b[0m\r\nbye\r\n"; r.stdout != want {
		t.Errorf("got stdout %q, want the output as it is %q", r.stdout, want)
	}
	if !strings.Contains(r.stderr, apitest.ExecRunning+" in "+apitest.SandboxRunning+"; Ctrl-] detaches") {
		t.Errorf("got stderr %q, want the detach key said", r.stderr)
	}

	// The default command is the login shell; TERM is the user's; --env and --cwd pass on.
	e.run(t, "", map[string]string{"TERM": "screen"}, "terminal", "--env", "A=b", "--cwd", "src", "--timeout-sec", "60", apitest.SandboxRunning).want(t, 5)
	req = e.ws.Last("Exec").Exec
	if len(req.Command) != 3 || req.Command[0] != "/bin/sh" || !strings.Contains(req.Command[2], `exec "$shell" -l`) ||
		req.Env["TERM"] != "screen" || req.Env["A"] != "b" || req.Cwd != "src" || *req.TimeoutSec != 60 {
		t.Errorf("the server got exec %+v, want the login shell, TERM=screen, A=b, src, 60 s", req)
	}

	// -o json: the exit as one line on stderr; the output stays as it is.
	r = e.run(t, "", nil, "-o", "json", "terminal", apitest.SandboxRunning).want(t, 5)
	var ev streamEvent
	if err := json.Unmarshal([]byte(r.stderr), &ev); err != nil || ev.Event != "exit" || ev.Exec == nil || *ev.Exec.ExitCode != 5 || ev.Cursor != "3-0" {
		t.Errorf("-o json: got stderr %q (%v), want the exit event", r.stderr, err)
	}
}

// The detach key leaves the command running and says how to reattach; --attach replays from
// the cursor.
func TestTerminalDetachAndAttach(t *testing.T) {
	e := newEnv(t)
	e.ws.ExecEvents[apitest.ExecRunning] = ttyEvents(0)[:1]
	e.ws.ExecHold = true
	in, typing := io.Pipe()
	go func() {
		_, _ = io.WriteString(typing, "echo hi\r")
		for len(e.ws.CallsTo("WriteStdin")) == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		_, _ = io.WriteString(typing, "ls\x1dnever sent")
		typing.Close()
	}()
	var stdout syncBuffer
	a := &app{stdin: in, stdout: &stdout, stderr: &stdout, getenv: func(k string) string {
		return map[string]string{"SANDBOX_GATEWAY_URL": e.srv.URL, "SANDBOX_API_KEY": apitest.UserKey}[k]
	}, httpClient: e.srv.Client()}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if code := run(ctx, []string{"terminal", apitest.SandboxRunning}, a); code != exitInterrupted {
		t.Fatalf("got exit code %d, want 130; it printed %q", code, stdout.String())
	}
	want := "sandboxctl: detached; " + apitest.ExecRunning + " runs on in the sandbox.\nreattach: sandboxctl terminal --attach " +
		apitest.ExecRunning + " (replays its output; add --after 1-0 for what follows only)\n"
	if !strings.HasSuffix(stdout.String(), want) {
		t.Errorf("got %q, want it to end with %q", stdout.String(), want)
	}
	var got string
	for _, c := range e.ws.CallsTo("WriteStdin") {
		got += string(c.Data)
	}
	if !strings.HasPrefix(got, "echo hi\r") || strings.Contains(got, "never") || strings.Contains(got, "\x1d") {
		t.Errorf("the server got input %q, want what came before the detach key only", got)
	}
	if calls := e.ws.Called(); slices.Contains(calls, "SignalExec") || slices.Contains(calls, "CancelExec") {
		t.Errorf("the server got %v, want nothing that ends the command", calls)
	}

	// Reattach after the cursor: the output after it, and the exit code.
	e.ws.ExecHold = false
	e.ws.ExecEvents[apitest.ExecRunning] = ttyEvents(3)
	r := e.run(t, "", nil, "terminal", "--attach", apitest.ExecRunning, "--after", "1-0").want(t, 3)
	if r.stdout != "bye\r\n" || e.ws.Last("ExecOutput").After != "1-0" {
		t.Errorf("--attach --after 1-0: got %q after %q, want bye only", r.stdout, e.ws.Last("ExecOutput").After)
	}
	if r := e.run(t, "", nil, "terminal", "--attach", "exec_other").want(t, exitServer); !strings.Contains(r.stderr, "NOT_FOUND") {
		t.Errorf("another tenant's exec: %q, want NOT_FOUND", r.stderr)
	}
}

func TestTerminalUsageAndTimeoutFallback(t *testing.T) {
	e := newEnv(t)
	for _, tt := range []struct {
		args []string
		msg  string
	}{
		{[]string{"terminal"}, "terminal wants a sandbox"},
		{[]string{"terminal", "--attach", apitest.ExecRunning, apitest.SandboxRunning}, "takes no sandbox or command"},
		{[]string{"terminal", "--after", "1-0", apitest.SandboxRunning}, "--after goes with --attach"},
		{[]string{"terminal", "--attach", apitest.ExecRunning, "--cwd", "x"}, "go with a new terminal"},
	} {
		if r := e.run(t, "", nil, tt.args...).want(t, exitUsage); !strings.Contains(r.stderr, tt.msg) {
			t.Errorf("%v: got %q, want %q", tt.args, r.stderr, tt.msg)
		}
	}
	// A server whose timeout bound is under a day: its default instead.
	e.ws.ExecEvents[apitest.ExecRunning] = ttyEvents(0)
	refused := 0
	e.cut.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/exec") || refused > 0 {
			return false
		}
		refused++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":{"code":"INVALID_ARGUMENT","field":"timeout_sec","message":"timeout_sec must be at most 3600"}}`))
		return true
	})
	e.run(t, "", nil, "terminal", apitest.SandboxRunning).want(t, exitOK)
	if req := e.ws.Last("Exec").Exec; refused != 1 || req.TimeoutSec != nil || req.Tty == nil {
		t.Errorf("after the refusal the server got %+v (refused %d), want the terminal without a timeout", req, refused)
	}
}

// Piped input (no terminal) goes to the command's stdin, closed at its end; an interrupt
// detaches.
func TestTerminalPipedInput(t *testing.T) {
	e := newEnv(t)
	e.ws.ExecEvents[apitest.ExecRunning] = ttyEvents(0)[:1]
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
	r := e.runCtx(t, ctx, "echo piped\n", nil, nil, nil, "terminal", apitest.SandboxRunning).want(t, exitInterrupted)
	if data, closed := stdinWrites(e); string(data) != "echo piped\n" || !closed {
		t.Errorf("the server took %q (closed %v), want the input, then stdin closed", data, closed)
	}
	if !strings.Contains(r.stderr, "detached; "+apitest.ExecRunning+" runs on") {
		t.Errorf("got stderr %q, want the detach", r.stderr)
	}
}
