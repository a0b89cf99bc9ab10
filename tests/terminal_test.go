package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"sandboxd/client"
	"sandboxd/tests/e2e"
)

const ttySubprotocol = "sandboxd.tty.v1"

// term is one terminal WebSocket and everything it received.
type term struct {
	c       *websocket.Conn
	mu      sync.Mutex
	out     []byte
	cursor  string // the last cursor the server reported
	control []map[string]any
	exit    map[string]any
	code    websocket.StatusCode
	reason  string
	done    chan struct{}
}

func termURL(s *e2e.Server, id, execID, query string) string {
	return "ws://" + s.Addr + e2e.Prefix + "/" + id + "/execs/" + execID + "/tty" + query
}

// dialTerm opens the terminal socket; headers are "Name: value"; first, when not "", is sent
// as the first message (a browser's authentication). It reads in the background.
func dialTerm(ctx context.Context, t *testing.T, s *e2e.Server, url string, subprotocol bool, first string, headers ...string) (*term, *http.Response, error) {
	t.Helper()
	h := http.Header{}
	for _, kv := range headers {
		k, v, _ := strings.Cut(kv, ":")
		h.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	opts := &websocket.DialOptions{HTTPHeader: h, HTTPClient: s.HTTPClient()}
	if subprotocol {
		opts.Subprotocols = []string{ttySubprotocol}
	}
	c, resp, err := websocket.Dial(ctx, url, opts)
	if err != nil {
		return nil, resp, err
	}
	t.Cleanup(func() { c.CloseNow() })
	c.SetReadLimit(8 << 20)
	if first != "" {
		if err := c.Write(ctx, websocket.MessageText, []byte(first)); err != nil {
			t.Fatal(err)
		}
	}
	tm := &term{c: c, done: make(chan struct{})}
	go func() {
		defer close(tm.done)
		for {
			typ, data, err := c.Read(context.Background())
			tm.mu.Lock()
			if err != nil {
				var ce websocket.CloseError
				if errors.As(err, &ce) {
					tm.code, tm.reason = ce.Code, ce.Reason
				} else {
					tm.code = -1
				}
				tm.mu.Unlock()
				return
			}
			if typ == websocket.MessageBinary || !subprotocol {
				tm.out = append(tm.out, data...)
			} else {
				var m map[string]any
				if json.Unmarshal(data, &m) == nil {
					tm.control = append(tm.control, m)
					switch m["type"] {
					case "cursor":
						tm.cursor, _ = m["cursor"].(string)
					case "exit":
						tm.exit = m
					}
				}
			}
			tm.mu.Unlock()
		}
	}()
	return tm, resp, nil
}

func (tm *term) output() string {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return string(tm.out)
}

// waitFor waits until the output holds every one of want, in this order after from.
func (tm *term) waitFor(t *testing.T, from int, want ...string) int {
	t.Helper()
	end := from
	e2e.Eventually(t, 60*time.Second, "terminal output "+strings.Join(want, ", "), func() (bool, string) {
		out := tm.output()
		pos := from
		for _, w := range want {
			i := strings.Index(out[min(pos, len(out)):], w)
			if i < 0 {
				return false, out
			}
			pos += i + len(w)
		}
		end = pos
		return true, ""
	})
	return end
}

func (tm *term) send(ctx context.Context, t *testing.T, typ websocket.MessageType, data string) {
	t.Helper()
	if err := tm.c.Write(ctx, typ, []byte(data)); err != nil {
		t.Fatalf("writing %q: %v", data, err)
	}
}

// closed waits for the socket to close and returns the close code and reason.
func (tm *term) closed(t *testing.T, d time.Duration) (websocket.StatusCode, string) {
	t.Helper()
	select {
	case <-tm.done:
	case <-time.After(d):
		t.Fatalf("the terminal socket is still open after %v", d)
	}
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.code, tm.reason
}

// TestTerminal: `bash -i` under a terminal, typed into over the WebSocket, resized over the
// socket, GraphQL and REST, detached and reattached with a cursor, replayed; then the socket's
// defences: no key, a bad key, another tenant, a foreign Origin, an oversize frame.
func TestTerminal(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{Extra: map[string]any{"graphql": map[string]any{"allowed_origins": []string{"dash.example.com"}}}})
	id := s.Create(t, e2e.CreateBody, e2e.HdrTenant1).SandboxID
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	bash := startDetached(t, s, id, `{"command":["bash","-i"],"tty":{"rows":24,"cols":80},"wait":false}`, e2e.HdrTenant1)
	if bash.Tty == nil || bash.Tty.Rows != 24 || bash.Tty.Cols != 80 || bash.StdinOpen == nil || !*bash.StdinOpen {
		t.Fatalf("bash -i under a terminal: got %+v, want tty 24x80 and stdin open", bash)
	}
	var detachedAt string
	e2e.Step(t, "type-resize-detach", func(t *testing.T) {
		tm, resp, err := dialTerm(ctx, t, s, termURL(s, id, bash.ExecID, ""), true, "", e2e.HdrTenant1)
		if err != nil {
			t.Fatalf("attaching: %v (%v)", err, resp)
		}
		if tm.c.Subprotocol() != ttySubprotocol {
			t.Fatalf("got subprotocol %q", tm.c.Subprotocol())
		}
		tm.send(ctx, t, websocket.MessageBinary, "stty size; echo $((6*7))\n")
		pos := tm.waitFor(t, 0, "24 80\r\n", "42\r\n")

		tm.send(ctx, t, websocket.MessageText, `{"type":"resize","rows":50,"cols":132}`)
		tm.send(ctx, t, websocket.MessageBinary, "stty size\n")
		pos = tm.waitFor(t, pos, "50 132\r\n")

		gql := dialGQL(ctx, t, s, e2e.KeyTenant1)
		var res struct {
			Tty       struct{ Rows, Cols int }
			StdinOpen bool
		}
		gql.do(t, `mutation($id: ID!) { resizeExecTty(execId: $id, rows: 30, cols: 100) { exec { tty { rows cols } stdinOpen } } }`,
			map[string]any{"id": bash.ExecID}).field(t, "resizeExecTty.exec", &res)
		if res.Tty.Rows != 30 || res.Tty.Cols != 100 || !res.StdinOpen {
			t.Fatalf("resizeExecTty: got %+v", res)
		}
		tm.send(ctx, t, websocket.MessageText, "stty size\n") // with the subprotocol a text frame is control
		tm.send(ctx, t, websocket.MessageBinary, "stty size\n")
		pos = tm.waitFor(t, pos, "30 100\r\n")
		r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/execs/"+bash.ExecID+"/resize", []byte(`{"rows":40,"cols":120}`), e2e.HdrJSON, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
		tm.send(ctx, t, websocket.MessageBinary, "stty size\n")
		tm.waitFor(t, pos, "40 120\r\n")
		if st := execStatus(t, s, id, bash.ExecID, e2e.HdrTenant1); st.Tty == nil || st.Tty.Rows != 40 || st.Tty.Cols != 120 || !*st.StdinOpen {
			t.Fatalf("status after the resizes: got %+v", st)
		}
		tm.mu.Lock()
		sawError := false
		for _, m := range tm.control {
			sawError = sawError || m["type"] == "error"
		}
		first := tm.control[0]
		tm.mu.Unlock()
		if first["type"] != "attached" || first["exec_id"] != bash.ExecID || !sawError {
			t.Fatalf("control messages: first %v, an error for the text frame %v", first, sawError)
		}

		// Detach: the exec runs on; the cursor says how far this client got.
		e2e.Eventually(t, 10*time.Second, "a cursor after the last output", func() (bool, string) {
			tm.mu.Lock()
			defer tm.mu.Unlock()
			return tm.cursor != "", "no cursor"
		})
		time.Sleep(200 * time.Millisecond) // let the last prompt's cursor arrive
		if err := tm.c.Close(websocket.StatusNormalClosure, "detach"); err != nil {
			t.Fatalf("detaching: %v", err)
		}
		<-tm.done
		tm.mu.Lock()
		detachedAt = tm.cursor
		tm.mu.Unlock()
		if st := execStatus(t, s, id, bash.ExecID, e2e.HdrTenant1); st.State != "RUNNING" {
			t.Fatalf("after the detach: got %+v, want RUNNING", st)
		}
	})

	e2e.Step(t, "reattach-and-replay", func(t *testing.T) {
		// While nobody is attached, input still reaches the terminal (REST stdin).
		r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/execs/"+bash.ExecID+"/stdin", []byte("echo detached-$((20+1))\n"), e2e.HdrTenant1)
		r.Want(t, http.StatusOK)

		tm, resp, err := dialTerm(ctx, t, s, termURL(s, id, bash.ExecID, "?after="+detachedAt), true, "", e2e.HdrTenant1)
		if err != nil {
			t.Fatalf("reattaching: %v (%v)", err, resp)
		}
		tm.waitFor(t, 0, "detached-21\r\n")
		if out := tm.output(); strings.Contains(out, "24 80") || strings.Contains(out, "42\r\n") || strings.Contains(out, "40 120") {
			t.Fatalf("the replay after %s repeats what came before it: %q", detachedAt, out)
		}
		tm.c.Close(websocket.StatusNormalClosure, "")

		// A browser: no header, the key in the first message, no subprotocol; the whole
		// kept output is replayed.
		tm, resp, err = dialTerm(ctx, t, s, termURL(s, id, bash.ExecID, ""), false, `{"X-Api-Key":"`+e2e.KeyTenant1+`"}`,
			"Origin: https://dash.example.com")
		if err != nil {
			t.Fatalf("attaching as a browser: %v (%v)", err, resp)
		}
		tm.waitFor(t, 0, "24 80\r\n", "42\r\n", "50 132\r\n", "30 100\r\n", "40 120\r\n", "detached-21\r\n")
		tm.c.Close(websocket.StatusNormalClosure, "")

		// execOutput over graphql-transport-ws streams the terminal as one stream.
		c := dialGraphQL(ctx, t, s)
		send(ctx, t, c, wsMsg{Type: "connection_init", Payload: rawJSON(t, map[string]any{"X-Api-Key": e2e.KeyTenant1})})
		if m := nextMsg(ctx, t, c); m.Type != "connection_ack" {
			t.Fatalf("got %s", m.Type)
		}
		send(ctx, t, c, wsMsg{ID: "1", Type: "subscribe", Payload: rawJSON(t, map[string]any{
			"query": `subscription($id: ID!) { execOutput(execId: $id) { kind stream data } }`, "variables": map[string]any{"id": bash.ExecID}})})
		var text strings.Builder
		for !strings.Contains(text.String(), "42") {
			m := nextMsg(ctx, t, c)
			var ev struct {
				Data struct {
					ExecOutput struct{ Kind, Stream, Data string }
				}
			}
			if err := json.Unmarshal(m.Payload, &ev); err != nil || m.Type != "next" {
				t.Fatalf("got %s %s", m.Type, m.Payload)
			}
			if o := ev.Data.ExecOutput; o.Kind == "CHUNK" {
				if o.Stream != "STDOUT" {
					t.Fatalf("a terminal chunk on %s, want STDOUT", o.Stream)
				}
				text.WriteString(o.Data)
			}
		}
		c.Close(websocket.StatusNormalClosure, "")
	})

	e2e.Step(t, "go-client-terminal-to-the-exit", func(t *testing.T) {
		c := s.Client(client.WithAPIKey(e2e.KeyTenant1))
		tt, err := c.Terminal(ctx, id, bash.ExecID, client.TerminalOptions{After: detachedAt})
		if err != nil {
			t.Fatal(err)
		}
		defer tt.Close()
		if info := tt.Info(); info.Tty == nil || info.Tty.Rows != 40 || !info.StdinOpen {
			t.Fatalf("attached: got %+v", info)
		}
		if _, err := tt.Write([]byte("echo via-client; exit 3\n")); err != nil {
			t.Fatal(err)
		}
		out, err := io.ReadAll(tt)
		if err != nil {
			t.Fatalf("reading to the end: %v (got %q)", err, out)
		}
		if !strings.Contains(string(out), "detached-21") || !strings.Contains(string(out), "via-client\r\n") {
			t.Fatalf("got %q", out)
		}
		if x := tt.Exit(); x == nil || x.ExitCode != 3 {
			t.Fatalf("exit: got %+v, want code 3", x)
		}
		if st := waitEnded(t, s, id, bash.ExecID, e2e.HdrTenant1); *st.ExitCode != 3 || *st.StdinOpen {
			t.Fatalf("status: got %+v", st)
		}
		// Attaching to the ended exec replays it and closes 1000 with the exit.
		tm, _, err := dialTerm(ctx, t, s, termURL(s, id, bash.ExecID, ""), true, "", e2e.HdrTenant1)
		if err != nil {
			t.Fatal(err)
		}
		if code, reason := tm.closed(t, 30*time.Second); code != websocket.StatusNormalClosure || reason != "exited: code 3" {
			t.Fatalf("got close %d %q", code, reason)
		}
		if tm.exit == nil || tm.exit["exit_code"] != 3.0 || !strings.Contains(tm.output(), "via-client") {
			t.Fatalf("replay of the ended exec: exit %v, output %q", tm.exit, tm.output())
		}
	})

	e2e.Step(t, "defences", func(t *testing.T) {
		sh := startDetached(t, s, id, `{"command":["sh","-c","cat >/dev/null"],"tty":{"rows":10,"cols":10},"wait":false}`, e2e.HdrTenant1)
		url := termURL(s, id, sh.ExecID, "")
		for name, tc := range map[string]struct {
			first string
			code  websocket.StatusCode
		}{
			"bad-key":        {`{"X-Api-Key":"not-a-key"}`, 4401},
			"no-key":         {`{"hello":"there"}`, 4401},
			"not-json":       {"ls\n", 4401},
			"another-tenant": {`{"X-Api-Key":"` + e2e.KeyTenant2 + `"}`, 4404},
		} {
			t.Run(name, func(t *testing.T) {
				tm, resp, err := dialTerm(ctx, t, s, url, false, tc.first)
				if err != nil {
					t.Fatalf("%v (%v)", err, resp)
				}
				if code, reason := tm.closed(t, 30*time.Second); code != tc.code || tm.output() != "" {
					t.Fatalf("got close %d %q and output %q, want %d and nothing", code, reason, tm.output(), tc.code)
				}
			})
		}
		t.Run("no-first-message", func(t *testing.T) {
			tm, resp, err := dialTerm(ctx, t, s, url, false, "")
			if err != nil {
				t.Fatalf("%v (%v)", err, resp)
			}
			if code, _ := tm.closed(t, 30*time.Second); code != 4408 {
				t.Fatalf("got close %d, want 4408", code)
			}
		})
		t.Run("another-tenant-header", func(t *testing.T) {
			_, resp, err := dialTerm(ctx, t, s, url, false, "", e2e.HdrTenant2)
			if err == nil || resp == nil || resp.StatusCode != http.StatusNotFound {
				t.Fatalf("got %v (%v), want 404", err, resp)
			}
		})
		t.Run("foreign-origin", func(t *testing.T) {
			for _, hdr := range [][]string{{"Origin: https://evil.example.com", e2e.HdrTenant1}, {"Origin: https://evil.example.com"}} {
				_, resp, err := dialTerm(ctx, t, s, url, false, "", hdr...)
				if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
					t.Fatalf("Origin evil with %v: got %v (%v), want 403", hdr, err, resp)
				}
			}
		})
		t.Run("oversize-frame", func(t *testing.T) {
			tm, _, err := dialTerm(ctx, t, s, url, false, "", e2e.HdrTenant1)
			if err != nil {
				t.Fatal(err)
			}
			_ = tm.c.Write(ctx, websocket.MessageBinary, make([]byte, 1<<20+1))
			if code, _ := tm.closed(t, 30*time.Second); code != websocket.StatusMessageTooBig {
				t.Fatalf("got close %d, want 1009", code)
			}
		})
		if st := execStatus(t, s, id, sh.ExecID, e2e.HdrTenant1); st.State != "RUNNING" {
			t.Fatalf("the refused sockets changed the exec: %+v", st)
		}
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/execs/"+sh.ExecID+"/signal", []byte(`{"signal":"SIGKILL"}`), e2e.HdrJSON, e2e.HdrTenant1).Want(t, http.StatusOK)
	})
}

// TestExampleTerminal builds examples/terminal and runs it the way its doc comment says: input
// piped into bash -i's terminal, the output back byte for byte, the exit code bash's own; then
// reattached to the ended exec after a cursor.
func TestExampleTerminal(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	id := s.Create(t, e2e.CreateBody, e2e.HdrTenant1).SandboxID
	bin := filepath.Join(t.TempDir(), "terminal")
	build := exec.Command("go", "build", "-o", bin, "./examples/terminal")
	build.Dir = e2e.ModuleRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the example: %v\n%s", err, out)
	}
	run := func(stdin string, args ...string) (stdout, stderr string, code int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "SANDBOX_GATEWAY_URL="+s.URL, "SANDBOX_API_KEY="+e2e.KeyTenant1)
		var o, e bytes.Buffer
		cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &o, &e
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			code = ee.ExitCode()
		case err != nil:
			t.Fatalf("running the example: %v", err)
		}
		return o.String(), e.String(), code
	}
	bash := startDetached(t, s, id, `{"command":["bash","-i"],"tty":{"rows":24,"cols":80},"wait":false}`, e2e.HdrTenant1)
	stdout, stderr, code := run("stty size; echo $((6*7)); exit 3\n", "-sandbox", id, "-exec", bash.ExecID)
	if !strings.Contains(stdout, "24 80\r\n42\r\n") || code != 3 {
		t.Fatalf("example: stdout %q, stderr %q, exit %d; want 24 80, 42 and exit 3", stdout, stderr, code)
	}
	again, _, code := run("", "-sandbox", id, "-exec", bash.ExecID)
	if again != stdout || code != 3 {
		t.Fatalf("reattached to the ended exec: %q, exit %d; want the same output and 3", again, code)
	}
	if _, stderr, code := run("", "-sandbox", id, "-exec", "exec_01ARZ3NDEKTSV4RRFFQ69G5FAV"); code != 1 || !strings.Contains(stderr, "NOT_FOUND") {
		t.Fatalf("an unknown exec: exit %d, stderr %q", code, stderr)
	}
}
