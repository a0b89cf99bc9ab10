package execs_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/domain/domaintest"
	"sandboxd/internal/execs"
	"sandboxd/internal/sandbox"
)

// detach starts a command without waiting.
func detach(t *testing.T, e *domaintest.Env, sbx string, req sandbox.ExecRequest) sandbox.ExecResult {
	t.Helper()
	req.Detach = true
	res, err := e.Svc.Exec(context.Background(), alice, sbx, req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// waitEnded follows an exec to its end and returns its output and final status.
func waitEnded(t *testing.T, e *domaintest.Env, execID string) ([]byte, sandbox.ExecResult) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch, err := e.Svc.ExecOutput(ctx, alice, execID, "")
	if err != nil {
		t.Fatal(err)
	}
	out, _, evs := domaintest.Collect(t, ch)
	last := evs[len(evs)-1]
	if last.Kind != sandbox.ExecExit {
		t.Fatalf("exec %s: the stream ended with %+v, want its exit", execID, last)
	}
	return out, *last.Result
}

// execAnswer is what a waited exec answered.
type execAnswer struct {
	res sandbox.ExecResult
	err error
}

// execInBackground runs Alice's waited exec in sandbox sbx, its answer sent on the channel.
func execInBackground(e *domaintest.Env, sbx string, req sandbox.ExecRequest) <-chan execAnswer {
	ch := make(chan execAnswer, 1)
	go func() {
		res, err := e.Svc.Exec(context.Background(), alice, sbx, req)
		ch <- execAnswer{res, err}
	}()
	return ch
}

// awaitAnswer is the answer ch brings, failing the test when none comes within d.
func awaitAnswer(t *testing.T, ch <-chan execAnswer, d time.Duration) execAnswer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(d):
		t.Fatalf("the exec did not answer within %v", d)
		return execAnswer{}
	}
}

func execIDs(rs []sandbox.ExecResult) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.ExecID
	}
	return out
}

func TestListExecs(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	other := e.CreateRunning(t, alice)
	first := e.MustExec(t, alice, sb.ID, "true")
	second := e.MustExec(t, alice, sb.ID, "sh", "-c", "exit 4")
	running := detach(t, e, sb.ID, sandbox.ExecRequest{Command: []string{"sleep", "60"}, StdinOpen: true})
	e.MustExec(t, alice, other.ID, "true")

	page, err := e.Svc.ListExecs(ctx, alice, sb.ID, sandbox.ExecListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := execIDs(page.Execs), []string{running.ExecID, second.ExecID, first.ExecID}; !slices.Equal(got, want) || page.NextCursor != "" {
		t.Fatalf("all: got %v (next %q), want %v", got, page.NextCursor, want)
	}
	if r := page.Execs[0]; r.State != sandbox.ExecRunning || !r.StdinOpen || r.Command != "sleep 60" || r.SandboxID != sb.ID {
		t.Fatalf("the running exec: got %+v", r)
	}
	if r := page.Execs[1]; r.State != sandbox.ExecEnded || r.ExitCode != 4 || r.StdinOpen || r.Stdout != nil {
		t.Fatalf("an ended exec: got %+v, want exit code 4 and no output", r)
	}
	for state, want := range map[sandbox.ExecState][]string{
		sandbox.ExecRunning: {running.ExecID},
		sandbox.ExecEnded:   {second.ExecID, first.ExecID},
		"ended":             {second.ExecID, first.ExecID},
	} {
		page, err := e.Svc.ListExecs(ctx, alice, sb.ID, sandbox.ExecListOptions{State: state})
		if err != nil || !slices.Equal(execIDs(page.Execs), want) {
			t.Fatalf("state %s: got %v, %v, want %v", state, execIDs(page.Execs), err, want)
		}
	}
	// Pages of one.
	var got []string
	after := ""
	for {
		page, err := e.Svc.ListExecs(ctx, alice, sb.ID, sandbox.ExecListOptions{Limit: 1, After: after})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, execIDs(page.Execs)...)
		if page.NextCursor == "" {
			break
		}
		after = page.NextCursor
	}
	if want := []string{running.ExecID, second.ExecID, first.ExecID}; !slices.Equal(got, want) {
		t.Fatalf("pages of one: got %v, want %v", got, want)
	}

	for name, tc := range map[string]struct {
		p    auth.Principal
		sbx  string
		opts sandbox.ExecListOptions
		code apierror.Code
	}{
		"other-tenant":    {bob, sb.ID, sandbox.ExecListOptions{}, apierror.NotFound},
		"unknown-sandbox": {alice, "sbx_01ARZ3NDEKTSV4RRFFQ69G5FAV", sandbox.ExecListOptions{}, apierror.NotFound},
		"bad-state":       {alice, sb.ID, sandbox.ExecListOptions{State: "DONE"}, apierror.InvalidArgument},
		"bad-cursor":      {alice, sb.ID, sandbox.ExecListOptions{After: "exec_{x}"}, apierror.InvalidArgument},
		"huge-page":       {alice, sb.ID, sandbox.ExecListOptions{Limit: 100000}, apierror.InvalidArgument},
		"negative-page":   {alice, sb.ID, sandbox.ExecListOptions{Limit: -1}, apierror.InvalidArgument},
	} {
		if _, err := e.Svc.ListExecs(ctx, tc.p, tc.sbx, tc.opts); apierror.CodeOf(err) != tc.code {
			t.Errorf("%s: got %v, want %s", name, err, tc.code)
		}
	}

	// A stopped sandbox still lists its execs, all ended now.
	if _, err := e.Svc.Stop(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	waitEnded(t, e, running.ExecID)
	page, err = e.Svc.ListExecs(ctx, alice, sb.ID, sandbox.ExecListOptions{State: sandbox.ExecEnded})
	if err != nil || len(page.Execs) != 3 {
		t.Fatalf("after the stop: got %v, %v, want the 3 execs ended", execIDs(page.Execs), err)
	}
}

// alive reports whether a host process exists and is not a zombie (the fake runtime's guest
// server runs commands on the host).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// treePids starts a script that prints "parent P child C" and returns the exec and the two
// pids once they are printed.
func treePids(t *testing.T, e *domaintest.Env, sbx string, script string) (sandbox.ExecResult, int, int) {
	t.Helper()
	res := detach(t, e, sbx, sandbox.ExecRequest{Command: []string{"sh", "-c", script}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch, err := e.Svc.ExecOutput(ctx, alice, res.ExecID, "")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`parent (\d+) child (\d+)\n`)
	var out []byte
	for ev := range ch {
		out = append(out, ev.Data...)
		if m := re.FindSubmatch(out); m != nil {
			cancel()
			for range ch {
			}
			parent, _ := strconv.Atoi(string(m[1]))
			child, _ := strconv.Atoi(string(m[2]))
			return res, parent, child
		}
	}
	t.Fatalf("no pids printed: %q", out)
	return res, 0, 0
}

func TestSignalExecReachesTheTree(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	// A foreground child (a background one of a non-interactive shell ignores SIGINT), and a
	// background one the parent waits for.
	foreground := `sh -c 'echo "parent $PPID child $$"; exec sleep 300'; echo unreachable`
	background := `sleep 300 & echo "parent $$ child $!"; wait`
	for _, tc := range []struct{ name, script, sig string }{
		{"SIGTERM", foreground, "SIGTERM"},
		{"SIGKILL", foreground, "SIGKILL"},
		{"INT", foreground, "INT"},
		{"background-SIGTERM", background, "SIGTERM"},
		{"background-SIGKILL", background, "SIGKILL"},
	} {
		sig := tc.sig
		t.Run(tc.name, func(t *testing.T) {
			res, parent, child := treePids(t, e, sb.ID, tc.script)
			if !alive(parent) || !alive(child) {
				t.Fatalf("the tree is not running: parent %v child %v", alive(parent), alive(child))
			}
			st, err := e.Svc.SignalExec(ctx, alice, sb.ID, res.ExecID, sig)
			if err != nil {
				t.Fatal(err)
			}
			if st.ExecID != res.ExecID {
				t.Fatalf("status of another exec: %+v", st)
			}
			_, end := waitEnded(t, e, res.ExecID)
			want := sig
			if !strings.HasPrefix(want, "SIG") {
				want = "SIG" + want
			}
			if end.Signal != want {
				t.Fatalf("ended with %+v, want signal %s", end, want)
			}
			deadline := time.Now().Add(5 * time.Second)
			for alive(parent) || alive(child) {
				if time.Now().After(deadline) {
					t.Fatalf("after %s: parent alive %v, child alive %v, want both gone", sig, alive(parent), alive(child))
				}
				time.Sleep(20 * time.Millisecond)
			}
			// Once ended, nothing is signalled.
			_, err = e.Svc.SignalExec(ctx, alice, "", res.ExecID, "SIGKILL")
			if ae, ok := err.(*apierror.Error); !ok || ae.Code != apierror.InvalidState || ae.Details["state"] != "ENDED" {
				t.Fatalf("signal of an ended exec: got %v, want INVALID_STATE with state ENDED", err)
			}
		})
	}
	running := detach(t, e, sb.ID, sandbox.ExecRequest{Command: []string{"sleep", "60"}})
	for name, call := range map[string]func() error{
		"other-tenant": func() error { _, err := e.Svc.SignalExec(ctx, bob, "", running.ExecID, "SIGKILL"); return err },
		"other-sandbox": func() error {
			_, err := e.Svc.SignalExec(ctx, alice, "sbx_01ARZ3NDEKTSV4RRFFQ69G5FAV", running.ExecID, "SIGKILL")
			return err
		},
		"junk-id": func() error { _, err := e.Svc.SignalExec(ctx, alice, "", "exec_../../x", "SIGKILL"); return err },
	} {
		if code := apierror.CodeOf(call()); code != apierror.NotFound {
			t.Errorf("%s: got %s, want NOT_FOUND", name, code)
		}
	}
	for _, sig := range []string{"", "SIGSTOP", "9", "SIGCONT", "KILL; rm -rf /"} {
		if _, err := e.Svc.SignalExec(ctx, alice, "", running.ExecID, sig); apierror.CodeOf(err) != apierror.InvalidArgument {
			t.Errorf("signal %q: got %v, want INVALID_ARGUMENT", sig, err)
		}
	}
	if st, _ := e.Svc.GetExec(ctx, alice, "", running.ExecID, false); st.State != sandbox.ExecRunning {
		t.Fatalf("refused signals ended the exec: %+v", st)
	}
}

func TestStdinStreamedInSeveralWrites(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	res := detach(t, e, sb.ID, sandbox.ExecRequest{Command: []string{"sha256sum"}, StdinOpen: true, Stdin: []byte("first ")})
	if !res.StdinOpen {
		t.Fatalf("detached exec with stdin_open: got %+v, want StdinOpen", res)
	}
	data := []byte("first ")
	// Any replica writes: every other write goes through a second one, with its own attach.
	replicas := []interface {
		WriteStdin(context.Context, auth.Principal, string, string, []byte, bool) (sandbox.StdinResult, error)
	}{e.Svc, e.Replica(t)}
	for i := range 5 {
		part := make([]byte, 100<<10+i)
		_, _ = rand.Read(part)
		var got sandbox.StdinResult
		var err error
		for range 100 { // the command reads as we go; a full buffer is retried
			got, err = replicas[i%2].WriteStdin(ctx, alice, sb.ID, res.ExecID, part, false)
			if apierror.CodeOf(err) != apierror.LimitExceeded {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil || got.Written != int64(len(part)) || got.Closed {
			t.Fatalf("write %d: got %+v, %v", i, got, err)
		}
		data = append(data, part...)
	}
	got, err := e.Svc.WriteStdin(ctx, alice, sb.ID, res.ExecID, []byte("last"), true)
	if err != nil || !got.Closed {
		t.Fatalf("last write with close: got %+v, %v", got, err)
	}
	data = append(data, "last"...)
	out, end := waitEnded(t, e, res.ExecID)
	sum := sha256.Sum256(data)
	if want := hex.EncodeToString(sum[:]) + "  -\n"; string(out) != want || end.ExitCode != 0 {
		t.Fatalf("sha256sum of the %d bytes written: got %q (exit %d), want %q", len(data), out, end.ExitCode, want)
	}
	if _, err := e.Svc.WriteStdin(ctx, alice, sb.ID, res.ExecID, []byte("x"), false); apierror.CodeOf(err) != apierror.InvalidState {
		t.Fatalf("write after the end: got %v, want INVALID_STATE", err)
	}
}

func TestStdinLimits(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	// A command that never reads: its stdin buffer fills, then a write is refused whole.
	never := detach(t, e, sb.ID, sandbox.ExecRequest{Command: []string{"sleep", "60"}, StdinOpen: true})
	var full error
	for i := 0; i < 10 && full == nil; i++ {
		_, full = e.Svc.WriteStdin(ctx, alice, sb.ID, never.ExecID, make([]byte, 512<<10), false)
	}
	ae, ok := full.(*apierror.Error)
	if !ok || ae.Code != apierror.LimitExceeded || ae.RetryAfter <= 0 || ae.Details["limit_name"] != "stdin_buffer_bytes" {
		t.Fatalf("writing to a command that never reads: got %v, want LIMIT_EXCEEDED (stdin_buffer_bytes) with Retry-After", full)
	}
	if _, err := e.Svc.WriteStdin(ctx, alice, sb.ID, never.ExecID, make([]byte, execs.MaxStdinWrite+1), false); apierror.CodeOf(err) != apierror.PayloadTooLarge {
		t.Fatalf("a write over MaxStdinWrite: got %v, want PAYLOAD_TOO_LARGE", err)
	}
	// Without stdin_open there is nothing to write to.
	closed := detach(t, e, sb.ID, sandbox.ExecRequest{Command: []string{"sleep", "60"}})
	if _, err := e.Svc.WriteStdin(ctx, alice, sb.ID, closed.ExecID, []byte("x"), false); apierror.CodeOf(err) != apierror.InvalidState {
		t.Fatalf("write to an exec without open stdin: got %v, want INVALID_STATE", err)
	}
	// Closing makes the status say so, and later writes are refused.
	cat := detach(t, e, sb.ID, sandbox.ExecRequest{Command: []string{"sh", "-c", "cat >/dev/null; sleep 60"}, StdinOpen: true})
	if _, err := e.Svc.WriteStdin(ctx, alice, sb.ID, cat.ExecID, nil, true); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.Svc.GetExec(ctx, alice, "", cat.ExecID, false); st.StdinOpen || st.State != sandbox.ExecRunning {
		t.Fatalf("after closing stdin: got %+v, want RUNNING with stdin closed", st)
	}
	if _, err := e.Svc.WriteStdin(ctx, alice, sb.ID, cat.ExecID, []byte("x"), false); apierror.CodeOf(err) != apierror.InvalidState {
		t.Fatalf("write after close: got %v, want INVALID_STATE", err)
	}
	if _, err := e.Svc.WriteStdin(ctx, bob, "", cat.ExecID, []byte("x"), false); apierror.CodeOf(err) != apierror.NotFound {
		t.Fatalf("another tenant's write: got %v, want NOT_FOUND", err)
	}
}

func TestTerminalAndResize(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	res := detach(t, e, sb.ID, sandbox.ExecRequest{Command: []string{"sh", "-c", "stty size; read line; stty size; echo err >&2"},
		Tty: &sandbox.TtySize{Rows: 24, Cols: 80}})
	if res.Tty == nil || *res.Tty != (sandbox.TtySize{Rows: 24, Cols: 80}) || !res.StdinOpen {
		t.Fatalf("a terminal exec: got %+v, want 24x80 with stdin open", res)
	}
	// Resize once the first size is out, then let it go on.
	ch, err := e.Svc.ExecOutput(ctx, alice, res.ExecID, "")
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for !bytes.Contains(out, []byte("24 80")) {
		ev, ok := <-ch
		if !ok {
			t.Fatalf("the output ended before the size: %q", out)
		}
		out = append(out, ev.Data...)
	}
	st, err := e.Svc.ResizeTty(ctx, alice, "", res.ExecID, sandbox.TtySize{Rows: 50, Cols: 132})
	if err != nil || st.Tty == nil || *st.Tty != (sandbox.TtySize{Rows: 50, Cols: 132}) {
		t.Fatalf("resize: got %+v, %v", st, err)
	}
	if _, err := e.Svc.WriteStdin(ctx, alice, "", res.ExecID, []byte("\n"), false); err != nil {
		t.Fatal(err)
	}
	var streams []string
	var last sandbox.ExecEvent
	for ev := range ch {
		out = append(out, ev.Data...)
		if ev.Kind == sandbox.ExecChunk && !slices.Contains(streams, ev.Stream) {
			streams = append(streams, ev.Stream)
		}
		last = ev
	}
	if last.Kind != sandbox.ExecExit || last.Result.Tty == nil || *last.Result.Tty != (sandbox.TtySize{Rows: 50, Cols: 132}) {
		t.Fatalf("the exit event: got %s with %+v, want EXIT with the terminal's last size, 50x132", last.Kind, last.Result)
	}
	if !regexp.MustCompile(`24 80\r\n(?s:.*)50 132\r\n(?s:.*)err\r\n`).Match(out) {
		t.Fatalf("terminal output: got %q, want 24 80, then 50 132, then err, with terminal line ends", out)
	}
	if !slices.Equal(streams, []string{"stdout"}) {
		t.Fatalf("a terminal's output came on %v, want stdout only", streams)
	}
	if got, _ := e.Svc.GetExec(ctx, alice, "", res.ExecID, false); got.Tty == nil || got.Tty.Rows != 50 || got.StdinOpen {
		t.Fatalf("status after the end: got %+v, want 50x132 and stdin closed", got)
	}

	plain := detach(t, e, sb.ID, sandbox.ExecRequest{Command: []string{"sleep", "60"}})
	tty := detach(t, e, sb.ID, sandbox.ExecRequest{Command: []string{"sleep", "60"}, Tty: &sandbox.TtySize{Rows: 1, Cols: 1}})
	for name, tc := range map[string]struct {
		id   string
		size sandbox.TtySize
		code apierror.Code
	}{
		"no-terminal": {plain.ExecID, sandbox.TtySize{Rows: 10, Cols: 10}, apierror.InvalidState},
		"ended":       {res.ExecID, sandbox.TtySize{Rows: 10, Cols: 10}, apierror.InvalidState},
		"zero":        {tty.ExecID, sandbox.TtySize{}, apierror.InvalidArgument},
		"huge":        {tty.ExecID, sandbox.TtySize{Rows: 1001, Cols: 10}, apierror.InvalidArgument},
		"negative":    {tty.ExecID, sandbox.TtySize{Rows: -1, Cols: 10}, apierror.InvalidArgument},
	} {
		if _, err := e.Svc.ResizeTty(ctx, alice, "", tc.id, tc.size); apierror.CodeOf(err) != tc.code {
			t.Errorf("%s: got %v, want %s", name, err, tc.code)
		}
	}
	if _, err := e.Svc.ResizeTty(ctx, bob, "", tty.ExecID, sandbox.TtySize{Rows: 10, Cols: 10}); apierror.CodeOf(err) != apierror.NotFound {
		t.Errorf("another tenant's resize: got %v, want NOT_FOUND", err)
	}
	for _, size := range []sandbox.TtySize{{}, {Rows: 0, Cols: 80}, {Rows: 24, Cols: 1001}} {
		_, err := e.Svc.Exec(ctx, alice, sb.ID, sandbox.ExecRequest{Command: []string{"true"}, Tty: &size})
		if apierror.CodeOf(err) != apierror.InvalidArgument {
			t.Errorf("exec with tty %+v: got %v, want INVALID_ARGUMENT", size, err)
		}
	}
}
