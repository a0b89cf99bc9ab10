package rest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/execs"
	"sandboxd/internal/sandbox"
)

// ttyEnv is the REST handler over the fake on a real HTTP server, with short timeouts.
type ttyEnv struct {
	f        *apitest.Fake
	h        *Handler
	srv      *httptest.Server
	shutdown chan struct{}
}

func newTtyEnv(t *testing.T, setup func(*apitest.Fake)) *ttyEnv {
	t.Helper()
	e := &ttyEnv{f: apitest.New(), shutdown: make(chan struct{})}
	e.f.ExecEvents[apitest.ExecRunning] = []sandbox.ExecEvent{
		{Kind: sandbox.ExecChunk, Cursor: "11-0", Stream: "stdout", Data: []byte("hello ")},
		{Kind: sandbox.ExecChunk, Cursor: "21-0", Stream: "stdout", Data: []byte("world\r\n")},
		{Kind: sandbox.ExecExit, Cursor: "21-1", Result: &sandbox.ExecResult{ExecID: apitest.ExecRunning, State: sandbox.ExecEnded, ExitCode: 3}},
	}
	if setup != nil {
		setup(e.f)
	}
	e.h = newTestHandler(t, e.f)
	e.h.shutdown = e.shutdown
	e.h.ttyInitTimeout, e.h.writeTimeout, e.h.keepAlive = 300*time.Millisecond, 500*time.Millisecond, time.Minute
	e.h.WithAllowedOrigins([]string{"dash.example.com"})
	e.srv = httptest.NewServer(e.h)
	t.Cleanup(func() {
		e.srv.Close()
		e.f.WaitStreams(t, 5*time.Second)
	})
	return e
}

func (e *ttyEnv) url(execID, query string) string {
	return "ws" + strings.TrimPrefix(e.srv.URL, "http") + Prefix + "/" + apitest.SandboxRunning + "/execs/" + execID + "/tty" + query
}

// dial opens the terminal socket; key "" sends no key header; control asks for the subprotocol.
func (e *ttyEnv) dial(t *testing.T, execID, query, key string, control bool, headers ...string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	h := http.Header{}
	if key != "" {
		h.Set("X-Api-Key", key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		h.Set(headers[i], headers[i+1])
	}
	opts := &websocket.DialOptions{HTTPHeader: h}
	if control {
		opts.Subprotocols = []string{TtySubprotocol}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, e.url(execID, query), opts)
	if c != nil {
		c.SetReadLimit(4 << 20)
		t.Cleanup(func() { c.CloseNow() })
	}
	return c, resp, err
}

// frame is one message the server sent.
type frame struct {
	typ  websocket.MessageType
	data []byte
}

// readAll reads frames until the socket closes, and returns them with the close status and
// reason.
func readAll(t *testing.T, c *websocket.Conn) ([]frame, websocket.StatusCode, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []frame
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				return out, ce.Code, ce.Reason
			}
			t.Fatalf("reading: %v (after %d frames)", err, len(out))
		}
		out = append(out, frame{typ, data})
	}
}

func control(t *testing.T, f frame) map[string]any {
	t.Helper()
	if f.typ != websocket.MessageText {
		t.Fatalf("got a binary frame %q, want a control message", f.data)
	}
	var m map[string]any
	if err := json.Unmarshal(f.data, &m); err != nil {
		t.Fatalf("control message %q: %v", f.data, err)
	}
	return m
}

// TestTtyPlainReplaysAndCloses: without the subprotocol the socket carries only the
// terminal's bytes, as binary frames, replays from the start or after a cursor, and closes
// 1000 with the exit in the reason once the exec ended.
func TestTtyPlainReplaysAndCloses(t *testing.T) {
	e := newTtyEnv(t, nil)
	c, _, err := e.dial(t, apitest.ExecRunning, "", apitest.UserKey, false)
	if err != nil {
		t.Fatal(err)
	}
	if c.Subprotocol() != "" {
		t.Fatalf("got subprotocol %q, want none", c.Subprotocol())
	}
	frames, code, reason := readAll(t, c)
	var out []byte
	for _, f := range frames {
		if f.typ != websocket.MessageBinary {
			t.Fatalf("got a text frame %q without the subprotocol, want binary frames only", f.data)
		}
		out = append(out, f.data...)
	}
	if string(out) != "hello world\r\n" || code != websocket.StatusNormalClosure || reason != "exited: code 3" {
		t.Fatalf("got %q, close %d %q; want the whole output, 1000 \"exited: code 3\"", out, code, reason)
	}
	c, _, err = e.dial(t, apitest.ExecRunning, "?after=11-0", apitest.UserKey, false)
	if err != nil {
		t.Fatal(err)
	}
	frames, _, _ = readAll(t, c)
	if len(frames) != 1 || string(frames[0].data) != "world\r\n" {
		t.Fatalf("after 11-0: got %v, want the second chunk only", frames)
	}
	if c := e.f.Last("ExecOutput"); c.After != "11-0" || c.ID != apitest.ExecRunning || c.Principal.Tenant != "acme" {
		t.Fatalf("the service got %+v", c)
	}
}

// TestTtyControlMessages: with the subprotocol the server says where the client attached,
// reports the cursor after output and sends the exit before closing.
func TestTtyControlMessages(t *testing.T) {
	e := newTtyEnv(t, func(f *apitest.Fake) {
		res := f.Execs[apitest.ExecRunning]
		res.StdinOpen, res.Tty = true, &sandbox.TtySize{Rows: 24, Cols: 80}
		f.Execs[apitest.ExecRunning] = res
	})
	c, _, err := e.dial(t, apitest.ExecRunning, "", apitest.UserKey, true)
	if err != nil {
		t.Fatal(err)
	}
	if c.Subprotocol() != TtySubprotocol {
		t.Fatalf("got subprotocol %q, want %s", c.Subprotocol(), TtySubprotocol)
	}
	frames, code, _ := readAll(t, c)
	if code != websocket.StatusNormalClosure || len(frames) < 4 {
		t.Fatalf("got %d frames and close %d", len(frames), code)
	}
	first := control(t, frames[0])
	if first["type"] != "attached" || first["exec_id"] != apitest.ExecRunning || first["stdin_open"] != true ||
		first["tty"].(map[string]any)["rows"] != 24.0 || first["state"] != "RUNNING" {
		t.Fatalf("first message: got %v", first)
	}
	var out []byte
	cursor := ""
	var exit map[string]any
	for _, f := range frames[1:] {
		if f.typ == websocket.MessageBinary {
			if exit != nil {
				t.Fatalf("output after the exit")
			}
			out = append(out, f.data...)
			continue
		}
		m := control(t, f)
		switch m["type"] {
		case "cursor":
			cursor = m["cursor"].(string)
		case "exit":
			exit = m
		default:
			t.Fatalf("unexpected control message %v", m)
		}
	}
	if string(out) != "hello world\r\n" || cursor != "21-0" {
		t.Fatalf("got %q and last cursor %q, want all the output and 21-0", out, cursor)
	}
	if exit == nil || exit["exit_code"] != 3.0 || exit["cursor"] != "21-1" || exit["timed_out"] != false {
		t.Fatalf("exit message: got %v", exit)
	}
}

// TestTtyInput: every client frame is input without the subprotocol; with it, binary frames
// are input and text frames control messages. Input reaches the exec's stdin in order, and
// refusals come back as error messages.
func TestTtyInput(t *testing.T) {
	e := newTtyEnv(t, func(f *apitest.Fake) {
		f.ExecEvents[apitest.ExecRunning] = nil
		f.ExecHold = true
	})
	ctx := context.Background()
	c, _, err := e.dial(t, apitest.ExecRunning, "", apitest.UserKey, false)
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	for i := range 200 {
		typ, data := websocket.MessageBinary, []byte{byte(i), 'x'}
		if i%2 == 1 {
			typ, data = websocket.MessageText, []byte("ls -l\n")
		}
		if err := c.Write(ctx, typ, data); err != nil {
			t.Fatal(err)
		}
		want = append(want, data...)
	}
	waitFor(t, "all input at the exec", func() bool { return bytes.Equal(stdinWritten(e.f), want) })
	if n := len(e.f.CallsTo("WriteStdin")); n > 200 {
		t.Fatalf("%d stdin writes for 200 frames, want them coalesced into at most one per frame", n)
	}
	for _, call := range e.f.CallsTo("WriteStdin") {
		if call.SandboxID != apitest.SandboxRunning || call.ID != apitest.ExecRunning || call.Close {
			t.Fatalf("the service got %+v", call)
		}
	}
	c.Close(websocket.StatusNormalClosure, "")

	c, _, err = e.dial(t, apitest.ExecRunning, "", apitest.UserKey, true)
	if err != nil {
		t.Fatal(err)
	}
	if m := readControl(t, c); m["type"] != "attached" {
		t.Fatalf("got %v, want attached", m)
	}
	before := len(stdinWritten(e.f))
	for _, m := range []string{`{"type":"resize","rows":50,"cols":132}`, `{"type":"close_stdin"}`} {
		if err := c.Write(ctx, websocket.MessageText, []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the resize", func() bool { return e.f.Last("ResizeTty").Tty == sandbox.TtySize{Rows: 50, Cols: 132} })
	waitFor(t, "the close", func() bool { return e.f.Last("WriteStdin").Close })
	if len(stdinWritten(e.f)) != before {
		t.Fatalf("control messages were written to stdin")
	}
	for msg, code := range map[string]string{
		`not json`:                     "INVALID_ARGUMENT",
		`{"type":"dance"}`:             "INVALID_ARGUMENT",
		`{"type":"resize","rows":0}`:   "INVALID_ARGUMENT",
		`{"type":"resize","rows":1e9}`: "INVALID_ARGUMENT",
	} {
		if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		if m := readControl(t, c); m["type"] != "error" || m["code"] != code {
			t.Fatalf("%s: got %v, want an error %s", msg, m, code)
		}
	}
	c.Close(websocket.StatusNormalClosure, "")

	// Input the exec refuses is reported once, and the socket stays for the output.
	e.f.StdinErr = apierror.New(apierror.InvalidState, "stdin is closed")
	c, _, err = e.dial(t, apitest.ExecRunning, "", apitest.UserKey, true)
	if err != nil {
		t.Fatal(err)
	}
	if m := readControl(t, c); m["type"] != "attached" {
		t.Fatalf("got %v, want attached", m)
	}
	calls := len(e.f.CallsTo("WriteStdin"))
	for range 3 {
		if err := c.Write(ctx, websocket.MessageBinary, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if m := readControl(t, c); m["type"] != "error" || m["code"] != "INVALID_STATE" {
		t.Fatalf("refused input: got %v, want INVALID_STATE", m)
	}
	time.Sleep(100 * time.Millisecond)
	if n := len(e.f.CallsTo("WriteStdin")) - calls; n != 1 {
		t.Fatalf("input after a refusal for good: %d writes, want 1", n)
	}
}

// TestTtyAttachAfterTheExit: attaching to an ended exec at its exit cursor answers the exit
// and closes 1000, with no output.
func TestTtyAttachAfterTheExit(t *testing.T) {
	e := newTtyEnv(t, nil)
	c, _, err := e.dial(t, apitest.ExecEnded, "?after=99-1", apitest.UserKey, true)
	if err != nil {
		t.Fatal(err)
	}
	frames, code, reason := readAll(t, c)
	if code != websocket.StatusNormalClosure || reason != "exited: code 3" || len(frames) != 2 {
		t.Fatalf("got %d frames, close %d %q; want attached and exit, 1000", len(frames), code, reason)
	}
	if m := control(t, frames[1]); m["type"] != "exit" || m["exit_code"] != 3.0 || m["cursor"] != "99-1" {
		t.Fatalf("got %v, want the exit at 99-1", m)
	}
}

func readControl(t *testing.T, c *websocket.Conn) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("reading a control message: %v", err)
		}
		if typ == websocket.MessageText {
			return control(t, frame{typ, data})
		}
	}
}

// stdinWritten is every byte the fake's WriteStdin got, in order.
func stdinWritten(f *apitest.Fake) []byte {
	var out []byte
	for _, c := range f.CallsTo("WriteStdin") {
		out = append(out, c.Data...)
	}
	return out
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 5s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestTtyFirstMessageAuth: an upgrade without a key authenticates with its first message, and
// is closed with 4401 for a missing or bad key, 4408 when nothing comes in time, and 4404 for
// an exec that is not the caller's.
func TestTtyFirstMessageAuth(t *testing.T) {
	e := newTtyEnv(t, nil)
	ctx := context.Background()
	for name, tc := range map[string]struct {
		first string
		code  websocket.StatusCode
	}{
		"good-key":      {`{"X-Api-Key":"` + apitest.UserKey + `"}`, websocket.StatusNormalClosure},
		"headers-key":   {`{"headers":{"x-api-key":"` + apitest.UserKey + `"}}`, websocket.StatusNormalClosure},
		"apiKey":        {`{"apiKey":"` + apitest.UserKey + `"}`, websocket.StatusNormalClosure},
		"bad-key":       {`{"X-Api-Key":"nope"}`, 4401},
		"no-key":        {`{"type":"auth"}`, 4401},
		"not-json":      {`ls -l`, 4401},
		"key-as-number": {`{"X-Api-Key":42}`, 4401},
		"scope-denied":  {`{"X-Api-Key":"` + apitest.UserKey + `","X-Sandbox-Tenant-Id":"other","X-Sandbox-Project-Id":"p"}`, 4401},
	} {
		t.Run(name, func(t *testing.T) {
			c, _, err := e.dial(t, apitest.ExecRunning, "", "", false)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Write(ctx, websocket.MessageText, []byte(tc.first)); err != nil {
				t.Fatal(err)
			}
			frames, code, reason := readAll(t, c)
			if code != tc.code {
				t.Fatalf("got close %d %q, want %d", code, reason, tc.code)
			}
			if code == websocket.StatusNormalClosure && len(frames) != 2 {
				t.Fatalf("authenticated: got %d frames, want the output", len(frames))
			}
			if code == 4401 && (len(frames) != 0 || !strings.HasPrefix(reason, "UNAUTHENTICATED: ")) {
				t.Fatalf("refused: got %d frames and reason %q", len(frames), reason)
			}
		})
	}
	t.Run("oversize-key-message", func(t *testing.T) {
		// Before a key is known, the server reads at most maxTtyKeyMessage of the first message.
		c, _, err := e.dial(t, apitest.ExecRunning, "", "", false)
		if err != nil {
			t.Fatal(err)
		}
		big := `{"X-Api-Key":"` + apitest.UserKey + `","pad":"` + strings.Repeat("x", maxTtyKeyMessage) + `"}`
		_ = c.Write(ctx, websocket.MessageText, []byte(big))
		if frames, code, _ := readAll(t, c); code != websocket.StatusMessageTooBig || len(frames) != 0 {
			t.Fatalf("got close %d after %d frames, want 1009 and nothing", code, len(frames))
		}
	})
	t.Run("timeout", func(t *testing.T) {
		c, _, err := e.dial(t, apitest.ExecRunning, "", "", false)
		if err != nil {
			t.Fatal(err)
		}
		if _, code, _ := readAll(t, c); code != 4408 {
			t.Fatalf("got close %d, want 4408", code)
		}
	})
	t.Run("rate-limited", func(t *testing.T) {
		var charged []string
		e.h.WithRateLimit(func(_ context.Context, p auth.Principal) error {
			charged = append(charged, p.Key)
			return apierror.New(apierror.RateLimited, "slow down").WithRetryAfter(time.Second)
		})
		defer e.h.WithRateLimit(nil)
		c, _, err := e.dial(t, apitest.ExecRunning, "", "", false)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Write(ctx, websocket.MessageText, []byte(`{"X-Api-Key":"`+apitest.UserKey+`"}`)); err != nil {
			t.Fatal(err)
		}
		if _, code, reason := readAll(t, c); code != 4429 || !strings.HasPrefix(reason, "RATE_LIMITED") || len(charged) != 1 {
			t.Fatalf("got close %d %q after %d charges, want 4429 RATE_LIMITED after one", code, reason, len(charged))
		}
	})
	t.Run("not-the-callers", func(t *testing.T) {
		c, _, err := e.dial(t, "exec_someone_elses", "", "", true)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Write(ctx, websocket.MessageText, []byte(`{"X-Api-Key":"`+apitest.UserKey+`"}`)); err != nil {
			t.Fatal(err)
		}
		if _, code, reason := readAll(t, c); code != 4404 || !strings.HasPrefix(reason, "NOT_FOUND: ") {
			t.Fatalf("got close %d %q, want 4404 NOT_FOUND", code, reason)
		}
	})
	t.Run("bad-cursor", func(t *testing.T) {
		c, _, err := e.dial(t, apitest.ExecRunning, "?after="+apitest.BadCursor, "", false)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Write(ctx, websocket.MessageText, []byte(`{"X-Api-Key":"`+apitest.UserKey+`"}`)); err != nil {
			t.Fatal(err)
		}
		if _, code, _ := readAll(t, c); code != 4400 {
			t.Fatalf("got close %d, want 4400", code)
		}
	})
}

// TestTtyRefusedBeforeTheUpgrade: with a key header, refusals are REST errors; a foreign Origin
// is 403; only the terminal's upgrade may come without a key.
func TestTtyRefusedBeforeTheUpgrade(t *testing.T) {
	e := newTtyEnv(t, nil)
	for name, tc := range map[string]struct {
		exec, query, key string
		headers          []string
		status           int
	}{
		"unknown-exec":    {"exec_unknown", "", apitest.UserKey, nil, http.StatusNotFound},
		"bad-key-header":  {apitest.ExecRunning, "", "nope", nil, http.StatusUnauthorized},
		"bad-cursor":      {apitest.ExecRunning, "?after=" + apitest.BadCursor, apitest.UserKey, nil, http.StatusBadRequest},
		"foreign-origin":  {apitest.ExecRunning, "", apitest.UserKey, []string{"Origin", "https://evil.example.com"}, http.StatusForbidden},
		"foreign-keyless": {apitest.ExecRunning, "", "", []string{"Origin", "https://evil.example.com"}, http.StatusForbidden},
	} {
		t.Run(name, func(t *testing.T) {
			_, resp, err := e.dial(t, tc.exec, tc.query, tc.key, false, tc.headers...)
			if err == nil || resp == nil || resp.StatusCode != tc.status {
				t.Fatalf("got %v (%v), want status %d", resp, err, tc.status)
			}
		})
	}
	if _, _, err := e.dial(t, apitest.ExecRunning, "", apitest.UserKey, false, "Origin", "https://dash.example.com"); err != nil {
		t.Fatalf("an allowed Origin: %v", err)
	}
	// A plain GET of the terminal path, with or without a key.
	h := e.h
	wantError(t, serve(t, h, http.MethodGet, execPath(apitest.ExecRunning, "tty"), ""), http.StatusBadRequest, "INVALID_ARGUMENT")
	wantError(t, serve(t, h, http.MethodGet, execPath(apitest.ExecRunning, "tty"), "", "X-Api-Key", ""), http.StatusUnauthorized, "UNAUTHENTICATED")
	// Another path's upgrade without a key is refused before anything.
	for _, p := range []string{execPath(apitest.ExecRunning, "output"), Prefix + "/" + apitest.SandboxRunning + "/execs/" + apitest.ExecRunning} {
		rec := serve(t, h, http.MethodGet, p, "", "X-Api-Key", "", "Upgrade", "websocket", "Connection", "Upgrade")
		wantError(t, rec, http.StatusUnauthorized, "UNAUTHENTICATED")
	}
	if n := len(e.f.CallsTo("GetExec")) + len(e.f.CallsTo("ExecOutput")); n == 0 {
		t.Fatalf("the allowed dials reached no service call")
	}
}

// TestTtyBounds: an input frame over MaxStdinWrite closes the socket (1009) without reaching
// the exec; a client that stops reading is cut off and its stream ends; shutdown closes with
// 1001.
func TestTtyBounds(t *testing.T) {
	t.Run("oversize-frame", func(t *testing.T) {
		e := newTtyEnv(t, func(f *apitest.Fake) { f.ExecEvents[apitest.ExecRunning], f.ExecHold = nil, true })
		c, _, err := e.dial(t, apitest.ExecRunning, "", apitest.UserKey, false)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Write(context.Background(), websocket.MessageBinary, make([]byte, execs.MaxStdinWrite+1))
		if _, code, _ := readAll(t, c); code != websocket.StatusMessageTooBig {
			t.Fatalf("got close %d, want 1009", code)
		}
		if n := len(e.f.CallsTo("WriteStdin")); n != 0 {
			t.Fatalf("an oversize frame reached stdin (%d writes)", n)
		}
	})
	t.Run("slow-reader", func(t *testing.T) {
		e := newTtyEnv(t, func(f *apitest.Fake) {
			f.ExecEvents[apitest.ExecRunning], f.ExecEndless = nil, bytes.Repeat([]byte("y"), 64<<10)
		})
		c, _, err := e.dial(t, apitest.ExecRunning, "", apitest.UserKey, false)
		if err != nil {
			t.Fatal(err)
		}
		_ = c // never read
		select {
		case end := <-e.f.ExecDone():
			if end.Drained {
				t.Fatalf("the endless stream drained")
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("a client that never reads still holds its output stream after 20s")
		}
	})
	t.Run("shutdown", func(t *testing.T) {
		e := newTtyEnv(t, func(f *apitest.Fake) { f.ExecEvents[apitest.ExecRunning], f.ExecHold = nil, true })
		c, _, err := e.dial(t, apitest.ExecRunning, "", apitest.UserKey, false)
		if err != nil {
			t.Fatal(err)
		}
		e.f.WaitSubscribed(t, 5*time.Second)
		close(e.shutdown)
		if _, code, _ := readAll(t, c); code != websocket.StatusGoingAway {
			t.Fatalf("got close %d, want 1001", code)
		}
	})
}

// TestTtyOrderAndFloods: input and resizes reach the exec in the order sent; a flood of
// resizes is coalesced (the last size wins) and spaced, not a call per message.
func TestTtyOrderAndFloods(t *testing.T) {
	e := newTtyEnv(t, func(f *apitest.Fake) { f.ExecEvents[apitest.ExecRunning], f.ExecHold = nil, true })
	ctx := context.Background()
	c, _, err := e.dial(t, apitest.ExecRunning, "", apitest.UserKey, true)
	if err != nil {
		t.Fatal(err)
	}
	if m := readControl(t, c); m["type"] != "attached" {
		t.Fatalf("got %v", m)
	}
	for i := 1; i <= 300; i++ {
		if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"resize","rows":`+strconv.Itoa(i)+`,"cols":80}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Write(ctx, websocket.MessageBinary, []byte("stty size\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the input after the resizes", func() bool { return string(e.f.Last("WriteStdin").Data) == "stty size\n" })
	var order []string
	for _, call := range e.f.Calls() {
		switch call.Method {
		case "ResizeTty":
			order = append(order, "resize "+strconv.Itoa(call.Tty.Rows))
		case "WriteStdin":
			order = append(order, "stdin "+string(call.Data))
		}
	}
	if len(order) < 2 || order[len(order)-1] != "stdin stty size\n" || order[len(order)-2] != "resize 300" {
		t.Fatalf("got %q, want the last resize (300 rows) and then the input", order)
	}
	if n := len(e.f.CallsTo("ResizeTty")); n > 20 {
		t.Fatalf("300 resize messages made %d resize calls, want them coalesced", n)
	}
}
