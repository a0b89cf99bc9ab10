package client_test

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"sandboxd/client"
	"sandboxd/internal/api/apitest"
	"sandboxd/internal/apierror"
	"sandboxd/internal/rest"
	"sandboxd/internal/sandbox"
)

func TestProcessControl(t *testing.T) {
	e := newEnv(t)
	c := e.client(t)
	ctx := ctxT(t)

	page, err := c.ListExecs(ctx, apitest.SandboxRunning, client.ListExecsOptions{State: client.ExecRunning, Limit: 5, Cursor: "exec_9"})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.fake.Last("ListExecs").ExecList; got != (sandbox.ExecListOptions{State: "RUNNING", Limit: 5, After: "exec_9"}) {
		t.Fatalf("the server got %+v", got)
	}
	if len(page.Execs) != 1 || page.Execs[0].ExecID != apitest.ExecRunning || page.Execs[0].State != client.ExecRunning {
		t.Fatalf("got %+v, want the running exec", page)
	}
	page, err = c.ListExecs(ctx, apitest.SandboxRunning, client.ListExecsOptions{Limit: 1})
	if err != nil || len(page.Execs) != 1 || page.NextCursor != apitest.ExecRunning {
		t.Fatalf("a page of one: got %+v, %v", page, err)
	}
	if _, err := c.ListExecs(ctx, "sbx_other", client.ListExecsOptions{}); !client.IsCode(err, client.CodeNotFound) {
		t.Fatalf("another sandbox: got %v, want NOT_FOUND", err)
	}

	st, err := c.SignalExec(ctx, apitest.SandboxRunning, apitest.ExecRunning, client.SIGTERM)
	if err != nil || st.ExecID != apitest.ExecRunning || e.fake.Last("SignalExec").Signal != "SIGTERM" {
		t.Fatalf("signal: got %+v, %v", st, err)
	}
	if _, err := c.SignalExec(ctx, apitest.SandboxRunning, apitest.ExecEnded, client.SIGKILL); !client.IsCode(err, client.CodeInvalidState) {
		t.Fatalf("signal of an ended exec: got %v, want INVALID_STATE", err)
	}

	res, err := c.WriteStdin(ctx, apitest.SandboxRunning, apitest.ExecRunning, []byte("\x00bin\xff"), true)
	if err != nil || res.Written != 5 || !res.Closed {
		t.Fatalf("write stdin: got %+v, %v", res, err)
	}
	if call := e.fake.Last("WriteStdin"); string(call.Data) != "\x00bin\xff" || !call.Close {
		t.Fatalf("the server got %+v", call)
	}
	e.fake.StdinErr = apierror.New(apierror.LimitExceeded, "full").WithRetryAfter(time.Second)
	_, err = c.WriteStdin(ctx, apitest.SandboxRunning, apitest.ExecRunning, []byte("x"), false)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != client.CodeLimitExceeded || ce.RetryAfter != time.Second {
		t.Fatalf("a full buffer: got %v, want LIMIT_EXCEEDED with RetryAfter 1s", err)
	}

	st, err = c.ResizeTty(ctx, apitest.SandboxRunning, apitest.ExecRunning, 50, 132)
	if err != nil || st.Tty == nil || *st.Tty != (client.TtySize{Rows: 50, Cols: 132}) || !st.StdinOpen {
		t.Fatalf("resize: got %+v, %v", st, err)
	}

	if _, err := c.ExecDetached(ctx, apitest.SandboxRunning, client.ExecRequest{Command: []string{"bash", "-i"}, StdinOpen: true,
		Tty: &client.TtySize{Rows: 24, Cols: 80}}); err != nil {
		t.Fatal(err)
	}
	if req := e.fake.Last("Exec").Exec; !req.StdinOpen || req.Tty == nil || *req.Tty != (sandbox.TtySize{Rows: 24, Cols: 80}) {
		t.Fatalf("the server got %+v", req)
	}
}

// killer is a server whose WebSocket connections a test can drop.
type killer struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (k *killer) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&killWriter{ResponseWriter: w, k: k}, r)
	})
}

func (k *killer) killAll() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := len(k.conns)
	for _, c := range k.conns {
		c.Close()
	}
	k.conns = nil
	return n
}

type killWriter struct {
	http.ResponseWriter
	k *killer
}

func (w *killWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.k.mu.Lock()
		w.k.conns = append(w.k.conns, conn)
		w.k.mu.Unlock()
	}
	return conn, brw, err
}

func (w *killWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// terminalEnv serves the REST handler over a fake whose running exec has output.
func terminalEnv(t *testing.T, events []sandbox.ExecEvent, hold bool) (*apitest.Fake, *client.Client, *killer) {
	t.Helper()
	f := apitest.New()
	f.ExecEvents[apitest.ExecRunning] = events
	f.ExecHold = hold
	k := &killer{}
	srv := httptest.NewServer(k.wrap(rest.New(f, apitest.Authenticator(t), slog.New(slog.DiscardHandler), nil)))
	t.Cleanup(func() {
		srv.Close()
		f.WaitStreams(t, 5*time.Second)
	})
	c, err := client.New(client.WithBaseURL(srv.URL), client.WithAPIKey(apitest.UserKey), client.WithHTTPClient(srv.Client()),
		client.WithReconnect(10*time.Millisecond, 50*time.Millisecond, 5))
	if err != nil {
		t.Fatal(err)
	}
	return f, c, k
}

func chunk(cursor, data string) sandbox.ExecEvent {
	return sandbox.ExecEvent{Kind: sandbox.ExecChunk, Cursor: cursor, Stream: "stdout", Data: []byte(data)}
}

func TestTerminalReadsToTheExit(t *testing.T) {
	_, c, _ := terminalEnv(t, []sandbox.ExecEvent{chunk("10-0", "$ ls\r\n"), chunk("20-0", "a b\r\n"),
		{Kind: sandbox.ExecExit, Cursor: "20-1", Result: &sandbox.ExecResult{State: sandbox.ExecEnded, ExitCode: 130, Signal: "SIGINT"}}}, false)
	ctx := ctxT(t)
	term, err := c.Terminal(ctx, apitest.SandboxRunning, apitest.ExecRunning, client.TerminalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer term.Close()
	if info := term.Info(); info.ExecID != apitest.ExecRunning || info.State != client.ExecRunning {
		t.Fatalf("info: got %+v", info)
	}
	out, err := io.ReadAll(term)
	if err != nil || string(out) != "$ ls\r\na b\r\n" {
		t.Fatalf("got %q, %v", out, err)
	}
	if x := term.Exit(); x == nil || x.ExitCode != 130 || x.Signal != "SIGINT" || x.Cursor != "20-1" {
		t.Fatalf("exit: got %+v", x)
	}
	if term.Cursor() != "20-1" {
		t.Fatalf("cursor after the exit: got %q, want 20-1", term.Cursor())
	}
	if _, err := term.Write([]byte("x")); err == nil {
		t.Fatalf("a write after the exit succeeded")
	}

	// Reattaching after a cursor replays what follows it.
	term2, err := c.Terminal(ctx, apitest.SandboxRunning, apitest.ExecRunning, client.TerminalOptions{After: "10-0"})
	if err != nil {
		t.Fatal(err)
	}
	defer term2.Close()
	if out, _ := io.ReadAll(term2); string(out) != "a b\r\n" {
		t.Fatalf("after 10-0: got %q", out)
	}
	for id, code := range map[string]string{"exec_unknown": client.CodeNotFound} {
		if _, err := c.Terminal(ctx, apitest.SandboxRunning, id, client.TerminalOptions{}); !client.IsCode(err, code) {
			t.Fatalf("%s: got %v, want %s", id, err, code)
		}
	}
	if _, err := c.Terminal(ctx, apitest.SandboxRunning, apitest.ExecRunning, client.TerminalOptions{After: apitest.BadCursor}); !client.IsCode(err, client.CodeInvalidArgument) {
		t.Fatalf("a bad cursor: got %v, want INVALID_ARGUMENT", err)
	}
}

func TestTerminalInputAndReattach(t *testing.T) {
	f, c, k := terminalEnv(t, []sandbox.ExecEvent{chunk("7-0", "prompt$ ")}, true)
	ctx := ctxT(t)
	var refused []error
	var mu sync.Mutex
	term, err := c.Terminal(ctx, apitest.SandboxRunning, apitest.ExecRunning, client.TerminalOptions{OnError: func(err error) {
		mu.Lock()
		refused = append(refused, err)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer term.Close()
	buf := make([]byte, 64<<10)
	n, err := term.Read(buf)
	if err != nil || string(buf[:n]) != "prompt$ " || term.Cursor() != "7-0" {
		t.Fatalf("got %q %v, cursor %q", buf[:n], err, term.Cursor())
	}
	if _, err := term.Write([]byte("echo hi\n")); err != nil {
		t.Fatal(err)
	}
	if err := term.Resize(40, 100); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { return f.Last("ResizeTty").Tty == sandbox.TtySize{Rows: 40, Cols: 100} })
	waitUntil(t, func() bool { return string(f.Last("WriteStdin").Data) == "echo hi\n" })

	// The connection drops: the terminal reattaches after its cursor and goes on.
	if k.killAll() == 0 {
		t.Fatal("no connection to drop")
	}
	waitUntil(t, func() bool { return term.Reconnects() == 1 && f.Last("ExecOutput").After == "7-0" })
	if _, err := term.Write([]byte("second\n")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { return string(f.Last("WriteStdin").Data) == "second\n" })
	if err := term.Resize(0, 0); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(refused) == 1 })
	if !client.IsCode(refused[0], client.CodeInvalidArgument) {
		t.Fatalf("a refused resize: got %v", refused[0])
	}
	if err := term.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { return f.Last("WriteStdin").Close })

	// Close detaches: reads end, the exec runs on.
	done := make(chan error, 1)
	go func() { _, err := term.Read(buf); done <- err }()
	if err := term.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, client.ErrTerminalClosed) {
		t.Fatalf("a read across Close: got %v, want ErrTerminalClosed", err)
	}
	if _, err := term.Write([]byte("x")); !errors.Is(err, client.ErrTerminalClosed) {
		t.Fatalf("a write after Close: got %v", err)
	}
	if n := len(f.CallsTo("SignalExec")); n != 0 {
		t.Fatalf("detaching signalled the exec")
	}
}

func waitUntil(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met after 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
