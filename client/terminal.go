package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// TerminalSubprotocol is the terminal WebSocket's subprotocol: binary frames carry the
// terminal's bytes both ways, text frames JSON control messages.
const TerminalSubprotocol = "sandboxd.tty.v1"

// terminalBuffer bounds the output a Terminal holds that Read has not taken: past it the
// Terminal stops reading from the socket (the server then cuts it off, and it reattaches
// from its cursor once Read catches up).
const terminalBuffer = 4 << 20

// ErrTerminalClosed is what a Terminal's calls answer after Close.
var ErrTerminalClosed = errors.New("client: the terminal is closed")

// TerminalOptions configure Terminal.
type TerminalOptions struct {
	// After is an output cursor (Terminal.Cursor, or an execOutput cursor): the terminal
	// starts with the output after it. "" replays all the output the server still keeps.
	After string
	// OnError, when set, is told about input and resizes the server refused (a *Error: e.g.
	// INVALID_STATE once the exec's stdin is closed). It runs on the Terminal's reading
	// goroutine: it must not block.
	OnError func(error)
}

// TerminalInfo is what the server said when the terminal (re)attached.
type TerminalInfo struct {
	ExecID    string
	SandboxID string
	// State is ExecRunning or ExecEnded.
	State     string
	StdinOpen bool
	// Tty is the terminal's size; nil for an exec without one (its output and stdin are
	// carried all the same).
	Tty *TtySize
}

// TerminalExit is how a terminal's exec ended.
type TerminalExit struct {
	ExitCode int
	Signal   string
	TimedOut bool
	Error    string
	// Cursor is the output cursor of the exit.
	Cursor string
}

// Terminal is an attached terminal: an exec's output to Read and its stdin to Write, over the
// WebSocket GET …/execs/{exec_id}/tty with TerminalSubprotocol. It survives dropped
// connections: it reattaches (with the client's reconnect backoff) after the cursor of the
// last output it received whole, so Read sees every byte once. Closing it detaches; the exec
// runs on, and a new Terminal with After set to Cursor goes on where this one stopped.
// Read, and Write, Resize and CloseStdin, may be called from different goroutines.
type Terminal struct {
	c                 *Client
	sandboxID, execID string
	onError           func(error)
	ctx               context.Context
	cancel            context.CancelFunc
	done              chan struct{}
	writeMu           sync.Mutex

	mu sync.Mutex
	// changed is closed (and replaced) whenever something below changes.
	changed    chan struct{}
	conn       *websocket.Conn // nil while reconnecting
	info       TerminalInfo
	resume     string // the cursor of the output received whole: where a reattach starts
	pending    []byte // output received after resume; dropped on a reattach
	ready      []terminalPiece
	buffered   int
	readCursor string
	exit       *TerminalExit
	err        error // why the terminal ended (io.EOF: the exec ended); nil while it runs
	closed     bool
	reconnects int
}

type terminalPiece struct {
	data   []byte
	cursor string
}

// Terminal attaches to an exec's terminal (or to any exec's output and stdin) and answers once
// the server took it. The context bounds the Terminal's whole life, as Close does.
func (c *Client) Terminal(ctx context.Context, sandboxID, execID string, opts TerminalOptions) (*Terminal, error) {
	t := &Terminal{c: c, sandboxID: sandboxID, execID: execID, onError: opts.OnError, done: make(chan struct{}),
		changed: make(chan struct{}), resume: opts.After, readCursor: opts.After}
	t.ctx, t.cancel = context.WithCancel(ctx)
	conn, err := t.dial()
	if err != nil {
		t.cancel()
		return nil, err
	}
	t.conn = conn
	go t.run(conn)
	return t, nil
}

// Info is what the server said at the latest attach.
func (t *Terminal) Info() TerminalInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.info
}

// Cursor is the output cursor of everything Read has returned (exact when each Read took
// whole chunks: give it a buffer of 64 KiB or more). Attach with it as After to go on there.
func (t *Terminal) Cursor() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.readCursor
}

// Exit is the exec's exit once the terminal has received it, else nil.
func (t *Terminal) Exit() *TerminalExit {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.exit
}

// Reconnects counts the reattaches after dropped connections.
func (t *Terminal) Reconnects() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reconnects
}

// Read reads the terminal's output. It answers io.EOF once the exec ended and every byte was
// read (Exit says how it ended), or the error that ended the terminal.
func (t *Terminal) Read(p []byte) (int, error) {
	for {
		t.mu.Lock()
		if len(t.ready) > 0 {
			piece := &t.ready[0]
			n := copy(p, piece.data)
			piece.data = piece.data[n:]
			t.buffered -= n
			if len(piece.data) == 0 {
				t.readCursor = piece.cursor
				t.ready = t.ready[1:]
			}
			t.broadcast()
			t.mu.Unlock()
			return n, nil
		}
		if t.err != nil {
			err := t.err
			t.mu.Unlock()
			return 0, err
		}
		ch := t.changed
		t.mu.Unlock()
		<-ch
	}
}

// Write sends input to the exec's stdin, in frames of at most MaxStdinWrite bytes. While the
// terminal reattaches it waits for the new connection; a frame whose write failed is sent
// again once on the next one.
func (t *Terminal) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		n := min(len(p), MaxStdinWrite)
		if err := t.send(websocket.MessageBinary, p[:n]); err != nil {
			return written, err
		}
		written += n
		p = p[n:]
	}
	return written, nil
}

// Resize sets the terminal's size (the command gets SIGWINCH). A size the server refuses is
// reported to OnError.
func (t *Terminal) Resize(rows, cols int) error {
	b, _ := json.Marshal(map[string]any{"type": "resize", "rows": rows, "cols": cols})
	return t.send(websocket.MessageText, b)
}

// CloseStdin closes the exec's stdin after the input written so far.
func (t *Terminal) CloseStdin() error {
	return t.send(websocket.MessageText, []byte(`{"type":"close_stdin"}`))
}

// Close detaches: the exec runs on. Read then answers what is left of the output it
// received, and then ErrTerminalClosed.
func (t *Terminal) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	conn := t.conn
	t.mu.Unlock()
	if conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		go func() { <-ctx.Done(); conn.CloseNow() }()
		_ = conn.Close(websocket.StatusNormalClosure, "detached")
		cancel()
	}
	t.cancel()
	<-t.done
	return nil
}

// broadcast wakes every waiter. Called with mu held.
func (t *Terminal) broadcast() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// finish ends the terminal with err (nil: the exec ended, io.EOF to Read).
func (t *Terminal) finish(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		err = ErrTerminalClosed
	case err == nil:
		err = io.EOF
	}
	if t.err == nil {
		t.err = err
	}
	t.conn = nil
	t.broadcast()
}

func (t *Terminal) url() string {
	u := t.c.base + sandboxPath(t.sandboxID, "execs", url.PathEscape(t.execID), "tty")
	if rest, ok := strings.CutPrefix(u, "https"); ok {
		u = "wss" + rest
	} else {
		u = "ws" + strings.TrimPrefix(u, "http")
	}
	t.mu.Lock()
	after := t.resume
	t.mu.Unlock()
	if after != "" {
		u += "?after=" + url.QueryEscape(after)
	}
	return u
}

// dial attaches and reads the server's first message.
func (t *Terminal) dial() (*websocket.Conn, error) {
	h := http.Header{}
	t.c.header(h)
	opts := &websocket.DialOptions{Subprotocols: []string{TerminalSubprotocol}, HTTPHeader: h}
	if t.c.http.Timeout == 0 {
		opts.HTTPClient = t.c.http
	}
	conn, resp, err := websocket.Dial(t.ctx, t.url(), opts)
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, restError(resp)
		}
		return nil, err
	}
	conn.SetReadLimit(wsReadLimit)
	if conn.Subprotocol() != TerminalSubprotocol {
		conn.CloseNow()
		return nil, fmt.Errorf("client: the server does not speak %s", TerminalSubprotocol)
	}
	typ, data, err := conn.Read(t.ctx)
	if err != nil {
		conn.CloseNow()
		return nil, closeError(err)
	}
	var m terminalMsg
	if typ != websocket.MessageText || json.Unmarshal(data, &m) != nil || m.Type != "attached" {
		conn.CloseNow()
		return nil, fmt.Errorf("client: the terminal's first message is %q, want attached", data)
	}
	t.mu.Lock()
	t.info = TerminalInfo{ExecID: m.ExecID, SandboxID: m.SandboxID, State: m.State, StdinOpen: m.StdinOpen, Tty: m.Tty}
	t.mu.Unlock()
	return conn, nil
}

// terminalMsg is a control message of the server.
type terminalMsg struct {
	Type      string   `json:"type"`
	Cursor    string   `json:"cursor"`
	ExecID    string   `json:"exec_id"`
	SandboxID string   `json:"sandbox_id"`
	State     string   `json:"state"`
	StdinOpen bool     `json:"stdin_open"`
	Tty       *TtySize `json:"tty"`
	ExitCode  int      `json:"exit_code"`
	Signal    string   `json:"signal"`
	TimedOut  bool     `json:"timed_out"`
	Error     string   `json:"error"`
	Code      string   `json:"code"`
	Message   string   `json:"message"`
}

// run reads the connection, and reattaches after a drop until the exec ends, a refusal that
// retrying cannot cure, too many failed attempts in a row, or Close.
func (t *Terminal) run(conn *websocket.Conn) {
	defer close(t.done)
	for {
		err := t.serve(conn)
		if err == nil || t.ctx.Err() != nil || permanent(err) {
			t.finish(err)
			return
		}
		t.mu.Lock()
		t.conn, t.pending = nil, nil
		t.broadcast()
		t.mu.Unlock()
		wait := t.c.backoff
		for failures := 1; ; failures++ {
			select {
			case <-time.After(wait):
			case <-t.ctx.Done():
				t.finish(t.ctx.Err())
				return
			}
			wait = min(2*wait, t.c.maxBackoff)
			conn, err = t.dial()
			if err == nil {
				break
			}
			if permanent(err) || failures >= t.c.retries || t.ctx.Err() != nil {
				t.finish(err)
				return
			}
		}
		t.mu.Lock()
		t.conn = conn
		t.reconnects++
		t.broadcast()
		t.mu.Unlock()
	}
}

// serve reads one connection's frames: nil when the exec ended, else why the connection did.
func (t *Terminal) serve(conn *websocket.Conn) error {
	for {
		if err := t.waitRoom(); err != nil {
			return err
		}
		typ, data, err := conn.Read(t.ctx)
		if err != nil {
			if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
				t.mu.Lock()
				ended := t.exit != nil || t.closed
				t.mu.Unlock()
				if ended {
					return nil
				}
			}
			return closeError(err)
		}
		if typ == websocket.MessageBinary {
			t.mu.Lock()
			t.pending = append(t.pending, data...)
			t.mu.Unlock()
			continue
		}
		var m terminalMsg
		if json.Unmarshal(data, &m) != nil {
			continue
		}
		switch m.Type {
		case "cursor", "truncated":
			t.commit(m.Cursor, nil)
		case "exit":
			t.commit(m.Cursor, &TerminalExit{ExitCode: m.ExitCode, Signal: m.Signal, TimedOut: m.TimedOut, Error: m.Error, Cursor: m.Cursor})
		case "error":
			if t.onError != nil {
				t.onError(&Error{Code: m.Code, Message: m.Message})
			}
		case "attached":
			t.mu.Lock()
			t.info = TerminalInfo{ExecID: m.ExecID, SandboxID: m.SandboxID, State: m.State, StdinOpen: m.StdinOpen, Tty: m.Tty}
			t.mu.Unlock()
		}
	}
}

// waitRoom waits while Read has terminalBuffer bytes to take.
func (t *Terminal) waitRoom() error {
	for {
		t.mu.Lock()
		if t.buffered < terminalBuffer {
			t.mu.Unlock()
			return nil
		}
		ch := t.changed
		t.mu.Unlock()
		select {
		case <-ch:
		case <-t.ctx.Done():
			return t.ctx.Err()
		}
	}
}

// commit makes the output received so far readable, at cursor.
func (t *Terminal) commit(cursor string, exit *TerminalExit) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.pending) > 0 {
		t.ready = append(t.ready, terminalPiece{data: t.pending, cursor: cursor})
		t.buffered += len(t.pending)
		t.pending = nil
	} else if len(t.ready) > 0 {
		t.ready[len(t.ready)-1].cursor = cursor
	} else if cursor != "" {
		t.readCursor = cursor
	}
	if cursor != "" {
		t.resume = cursor
	}
	if exit != nil {
		t.exit = exit
	}
	t.broadcast()
}

// send writes one frame on the current connection, waiting for one while the terminal
// reattaches; a write that fails is tried again once on the next connection.
func (t *Terminal) send(typ websocket.MessageType, data []byte) error {
	var failed *websocket.Conn
	for {
		conn, err := t.nextConn(failed)
		if err != nil {
			return err
		}
		t.writeMu.Lock()
		ctx, cancel := context.WithTimeout(t.ctx, 30*time.Second)
		err = conn.Write(ctx, typ, data)
		cancel()
		t.writeMu.Unlock()
		if err == nil {
			return nil
		}
		if failed != nil {
			return err
		}
		failed = conn
	}
}

// nextConn waits for a connection other than not.
func (t *Terminal) nextConn(not *websocket.Conn) (*websocket.Conn, error) {
	for {
		t.mu.Lock()
		conn, err, closed, ch := t.conn, t.err, t.closed, t.changed
		t.mu.Unlock()
		switch {
		case closed:
			return nil, ErrTerminalClosed
		case err != nil:
			return nil, err
		case conn != nil && conn != not:
			return conn, nil
		}
		<-ch
	}
}

// closeError turns the server's refusal in a close frame (4000 + an HTTP status, "CODE:
// message") into a *Error.
func closeError(err error) error {
	st := websocket.CloseStatus(err)
	if st < 4000 || st >= 5000 {
		return err
	}
	var ce websocket.CloseError
	errors.As(err, &ce)
	code, msg, ok := strings.Cut(ce.Reason, ": ")
	if !ok {
		code, msg = "", ce.Reason
	}
	return &Error{Status: int(st) - 4000, Code: code, Message: msg, Details: map[string]any{"close_code": int(st)}}
}

// permanent reports whether reattaching cannot cure err: a refusal of the request itself
// (4xx but a timeout or a rate limit), or a frame the server would not take.
func permanent(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Status >= 400 && e.Status < 500 && e.Status != http.StatusRequestTimeout && e.Status != http.StatusTooManyRequests
	}
	switch websocket.CloseStatus(err) {
	case websocket.StatusPolicyViolation, websocket.StatusMessageTooBig, websocket.StatusUnsupportedData, websocket.StatusProtocolError:
		return true
	}
	return false
}
