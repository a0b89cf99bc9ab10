package rest

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/execs"
	"sandboxd/internal/sandbox"
)

// The interactive terminal: GET …/{id}/execs/{exec_id}/tty upgrades to a WebSocket that carries
// an exec's output to the client and the client's input to the exec's stdin, so that a terminal
// front end (xterm.js's AttachAddon) attaches directly.
//
//   - Without a subprotocol the server sends only the terminal's bytes, as binary frames, and
//     takes every client frame, text or binary, as input.
//   - With the subprotocol TtySubprotocol, binary frames are still the bytes both ways, and text
//     frames are JSON control messages. The client sends {"type":"resize","rows":R,"cols":C}
//     and {"type":"close_stdin"}; the server sends {"type":"attached",…} first, then
//     {"type":"cursor","cursor":C} after output (C is an execOutput cursor: reattach with
//     ?after=C to get exactly what follows), {"type":"truncated",…} where the kept output has a
//     gap, {"type":"error","code","message"} when input or a resize was refused, and
//     {"type":"exit",…} with the exit status last.
//
// Either way the output starts after ?after= (an execOutput cursor), or with the whole kept
// output; when the exec ends the server closes with 1000. Closing the socket does not end the
// exec: a terminal outlives its client. Any replica serves it: the output comes from the
// exec's stream, the input goes through the sandbox's guest init.
//
// A browser cannot set headers on a WebSocket, so this is the one route whose upgrade may come
// without X-Api-Key: its first message must then carry the key ({"X-Api-Key":"…"}, also as
// "x-api-key" or "apiKey", optionally with the scope keys, at the top level or under
// "headers", as a GraphQL connection_init payload does) within the init timeout. Close codes:
// 4401 no or a bad key, 4408 no first message in time, 4429 over the rate limit, and 4000 plus
// the HTTP status of any other refusal (4404 an exec that is not the caller's, 4400 a bad
// cursor, 4503 no stream place free); 1001 when the server shuts down (reattach), 1011 when
// the output stream broke (reattach with the last cursor).

// TtySubprotocol is the WebSocket subprotocol of the terminal's control messages.
const TtySubprotocol = "sandboxd.tty.v1"

// ttyRoute is the terminal's route.
const ttyRoute = "GET " + Prefix + "/{id}/execs/{exec_id}/tty"

const (
	// ttyInitTimeout is how long a socket without a key may take to send its first message.
	ttyInitTimeout = 10 * time.Second
	// Close codes of the terminal socket beyond 4000 + an HTTP status.
	ttyCloseInitTimeout = 4408
	// maxCloseReason is the longest reason a close frame carries.
	maxCloseReason = 123
	// maxTtyKeyMessage bounds the first message of a socket opened without a key (its key
	// message); a longer one closes the socket with 1009.
	maxTtyKeyMessage = 8 << 10
)

// WithAllowedOrigins sets the Origin host patterns, besides the server's own host, from which
// a browser page may open the terminal WebSocket (coder/websocket OriginPatterns, as the
// GraphQL WebSocket checks them: graphql.allowed_origins). A foreign Origin gets 403.
func (h *Handler) WithAllowedOrigins(patterns []string) *Handler {
	h.wsOrigins = patterns
	return h
}

// keylessTty reports whether r may reach the mux without a key: only the terminal route's
// WebSocket upgrade, which authenticates in its first message.
func (h *Handler) keylessTty(r *http.Request) bool {
	if r.Header.Get(auth.HeaderAPIKey) != "" || !auth.IsWebSocketUpgrade(r) {
		return false
	}
	_, pattern := h.mux.Handler(r)
	return pattern == ttyRoute
}

// tty serves the terminal WebSocket.
func (h *Handler) tty(w http.ResponseWriter, r *http.Request) {
	t := &ttySession{h: h, sandboxID: r.PathValue("id"), execID: r.PathValue("exec_id"), after: r.URL.Query().Get("after"),
		log: h.log.With("sandbox", r.PathValue("id"), "exec", r.PathValue("exec_id"))}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	p, keyed := auth.FromContext(ctx)
	if keyed {
		// Authenticated by the header: refusals are plain REST errors, before the upgrade;
		// another tenant's exec is NOT_FOUND whatever the request is.
		if err := t.open(ctx, p); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	if !auth.IsWebSocketUpgrade(r) {
		h.fail(w, r, apierror.New(apierror.InvalidArgument, "this path is a WebSocket: open it with an upgrade (see the README, Terminals)"))
		return
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{TtySubprotocol}, OriginPatterns: h.wsOrigins})
	if err != nil {
		return // Accept answered (403 for a foreign Origin)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(execs.MaxStdinWrite)
	t.conn, t.control = conn, conn.Subprotocol() == TtySubprotocol
	if !keyed {
		// Nobody is known yet: the key message is small, so a stranger cannot make the
		// server read a whole input frame's worth before being refused.
		conn.SetReadLimit(maxTtyKeyMessage)
		if p, err = t.authenticate(ctx); err != nil {
			return
		}
		conn.SetReadLimit(execs.MaxStdinWrite)
		if err := t.open(ctx, p); err != nil {
			t.closeWith(err)
			return
		}
	}
	t.p = p
	t.run(ctx, cancel)
}

// ttySession is one terminal WebSocket.
type ttySession struct {
	h                          *Handler
	log                        *slog.Logger
	conn                       *websocket.Conn
	control                    bool // the subprotocol is on
	p                          auth.Principal
	sandboxID, execID, after   string
	status                     sandbox.ExecResult
	out                        <-chan sandbox.ExecEvent
	inputDead                  bool // the exec refused input for good (reported once)
	inputMu                    sync.Mutex
	ops                        []ttyOp // input and resizes waiting for the exec, in order
	queued                     int     // input bytes in ops
	inputReady, inputRoom      chan struct{}
	lastCursor, cursorReported string
}

// open loads the exec's status and opens its output after the cursor, in one call: NOT_FOUND
// unless the exec is the caller's, in this sandbox.
func (t *ttySession) open(ctx context.Context, p auth.Principal) error {
	st, ch, err := t.h.svc.ExecOutputStatus(ctx, p, t.sandboxID, t.execID, t.after)
	t.status, t.out = st, ch
	return err
}

// authenticate reads the first message, which must carry a key, within ttyInitTimeout, and
// charges the connection to the key's rate limit. On failure the socket is closed.
func (t *ttySession) authenticate(ctx context.Context) (auth.Principal, error) {
	timeout := t.h.ttyInitTimeout
	if timeout <= 0 {
		timeout = ttyInitTimeout
	}
	timer := time.AfterFunc(timeout, func() {
		_ = t.conn.Close(ttyCloseInitTimeout, "no authentication message in time: send {\"X-Api-Key\":\"…\"} first")
	})
	_, data, err := t.conn.Read(ctx)
	if !timer.Stop() {
		return auth.Principal{}, errors.New("tty: init timeout")
	}
	if err != nil {
		return auth.Principal{}, err
	}
	var msg map[string]any
	if json.Unmarshal(data, &msg) != nil {
		msg = nil
	}
	key := firstValue(msg, auth.HeaderAPIKey, "x-api-key", "apiKey")
	if key == "" {
		e := apierror.New(apierror.Unauthenticated, "missing API key: send {\"X-Api-Key\":\"…\"} as the first message")
		t.closeWith(e)
		return auth.Principal{}, e
	}
	p, err := t.h.auth.Authenticate(key, firstValue(msg, auth.HeaderTenant, "x-sandbox-tenant-id"),
		firstValue(msg, auth.HeaderProject, "x-sandbox-project-id"))
	if err != nil {
		e := apierror.From(err)
		if e.Code == apierror.PermissionDenied {
			e = &apierror.Error{Code: apierror.Unauthenticated, Message: e.Message}
		}
		t.closeWith(e)
		return auth.Principal{}, e
	}
	if t.h.limit != nil {
		if err := t.h.limit(ctx, p); err != nil {
			t.closeWith(err)
			return auth.Principal{}, err
		}
	}
	return p, nil
}

// firstValue is the first non-empty string among names, at msg's top level or under its
// "headers" object.
func firstValue(msg map[string]any, names ...string) string {
	headers, _ := msg["headers"].(map[string]any)
	for _, m := range []map[string]any{msg, headers} {
		for _, n := range names {
			if s, _ := m[n].(string); s != "" {
				return s
			}
		}
	}
	return ""
}

// closeWith closes the socket for err: 4000 plus its code's HTTP status, "CODE: message".
func (t *ttySession) closeWith(err error) {
	e := apierror.From(err)
	if e.Code == apierror.Internal || e.Code == apierror.Unavailable {
		t.log.Warn("terminal refused", "code", e.Code, "err", err)
	}
	_ = t.conn.Close(websocket.StatusCode(4000+e.Code.HTTPStatus()), cutReason(string(e.Code)+": "+e.Message))
}

// cutReason cuts s to fit a close frame, at a character boundary.
func cutReason(s string) string {
	if len(s) <= maxCloseReason {
		return s
	}
	n := maxCloseReason
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// run serves the socket until the exec ends, the client goes away, a write misses its
// deadline, or the server shuts down. The output goes out from this goroutine; the client's
// frames are read by another and written to stdin by a third, so neither direction waits for
// the other.
func (t *ttySession) run(ctx context.Context, cancel context.CancelFunc) {
	t.inputReady, t.inputRoom = make(chan struct{}, 1), make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(3)
	go func() { defer wg.Done(); defer cancel(); t.read(ctx) }()
	go func() { defer wg.Done(); t.writeInput(ctx) }()
	go func() { defer wg.Done(); defer cancel(); t.keepAlive(ctx) }()
	if t.control {
		st := t.status
		msg := map[string]any{"type": "attached", "exec_id": st.ExecID, "sandbox_id": st.SandboxID, "state": st.State,
			"stdin_open": st.StdinOpen, "cursor": t.after}
		if st.Tty != nil {
			msg["tty"] = ttyBody{Rows: st.Tty.Rows, Cols: st.Tty.Cols}
		}
		if t.sendJSON(ctx, msg) != nil {
			return
		}
	}
	code, reason := t.pumpOutput(ctx)
	if code != 0 {
		_ = t.conn.Close(code, cutReason(reason))
	}
}

// pumpOutput writes the exec's output until its exit (then 1000 and a reason), the end of the
// stream (1011), shutdown (1001) or a failed write or a gone client (0: nothing to close).
func (t *ttySession) pumpOutput(ctx context.Context) (websocket.StatusCode, string) {
	for {
		var ev sandbox.ExecEvent
		var ok bool
		select {
		case ev, ok = <-t.out:
		default:
			// Nothing more is ready: tell the client how far it has come.
			if t.reportCursor(ctx) != nil {
				return 0, ""
			}
			select {
			case ev, ok = <-t.out:
			case <-ctx.Done():
				return 0, ""
			case <-t.h.shutdown:
				return websocket.StatusGoingAway, "the server is shutting down: reattach with the last cursor"
			}
		}
		if !ok {
			if ctx.Err() != nil {
				return 0, ""
			}
			select {
			case <-t.h.shutdown:
				return websocket.StatusGoingAway, "the server is shutting down: reattach with the last cursor"
			default:
			}
			// Attached at (or after) the exit: the stream has nothing more, and the exec ended.
			if st, err := t.h.svc.GetExec(ctx, t.p, t.sandboxID, t.execID, false); err == nil && st.State == sandbox.ExecEnded {
				cursor := t.lastCursor
				if cursor == "" {
					cursor = t.after
				}
				ev, ok = sandbox.ExecEvent{Kind: sandbox.ExecExit, Cursor: cursor, Result: &st}, true
			} else {
				return websocket.StatusInternalError, "the output stream broke: reattach with the last cursor"
			}
		}
		switch ev.Kind {
		case sandbox.ExecChunk:
			if t.write(ctx, websocket.MessageBinary, ev.Data) != nil {
				return 0, ""
			}
			t.lastCursor = ev.Cursor
		case sandbox.ExecTruncated:
			t.lastCursor = ev.Cursor
			if t.control && t.sendJSON(ctx, map[string]any{"type": "truncated", "missed_bytes": ev.MissedBytes, "cursor": ev.Cursor}) != nil {
				return 0, ""
			}
			t.cursorReported = ev.Cursor
		case sandbox.ExecExit:
			var res sandbox.ExecResult
			if ev.Result != nil {
				res = *ev.Result
			}
			if t.control {
				msg := map[string]any{"type": "exit", "cursor": ev.Cursor, "exit_code": res.ExitCode, "timed_out": res.TimedOut}
				if res.Signal != "" {
					msg["signal"] = res.Signal
				}
				if res.Error != "" {
					msg["error"] = res.Error
				}
				if t.reportCursor(ctx) != nil || t.sendJSON(ctx, msg) != nil {
					return 0, ""
				}
			}
			return websocket.StatusNormalClosure, exitReason(res)
		}
	}
}

// exitReason is the close reason of an ended exec.
func exitReason(r sandbox.ExecResult) string {
	switch {
	case r.TimedOut:
		return "exited: timed out"
	case r.Signal != "":
		return "exited: signal " + r.Signal
	case r.Error != "":
		return "exited: " + r.Error
	}
	return "exited: code " + strconv.Itoa(r.ExitCode)
}

// reportCursor sends the cursor of the output written so far, once (subprotocol only).
func (t *ttySession) reportCursor(ctx context.Context) error {
	if !t.control || t.lastCursor == "" || t.lastCursor == t.cursorReported {
		return nil
	}
	t.cursorReported = t.lastCursor
	return t.sendJSON(ctx, map[string]any{"type": "cursor", "cursor": t.lastCursor})
}

func (t *ttySession) sendJSON(ctx context.Context, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return t.write(ctx, websocket.MessageText, data)
}

// write sends one frame within the write timeout; a client that does not take it in time is
// cut off (coder/websocket closes the connection when the write's context ends).
func (t *ttySession) write(ctx context.Context, typ websocket.MessageType, data []byte) error {
	wctx, cancel := context.WithTimeout(ctx, t.h.writeTimeout)
	defer cancel()
	return t.conn.Write(wctx, typ, data)
}

// keepAlive pings the client while the socket is idle, so that proxies keep it open; a client
// that does not answer within the write timeout is cut off.
func (t *ttySession) keepAlive(ctx context.Context) {
	tick := time.NewTicker(t.h.keepAlive)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			pctx, cancel := context.WithTimeout(ctx, t.h.writeTimeout)
			err := t.conn.Ping(pctx)
			cancel()
			if err != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// read takes the client's frames: input, or with the subprotocol control messages in text
// frames. It waits (and so stops reading from the socket) while a full MaxStdinWrite of input
// waits for the exec.
func (t *ttySession) read(ctx context.Context) {
	for {
		typ, data, err := t.conn.Read(ctx)
		if err != nil {
			return
		}
		if t.control && typ == websocket.MessageText {
			t.controlMessage(ctx, data)
			continue
		}
		if len(data) == 0 {
			continue
		}
		if !t.queue(ctx, ttyOp{data: data}) {
			return
		}
	}
}

// controlMessage acts on one client control message.
func (t *ttySession) controlMessage(ctx context.Context, data []byte) {
	var msg struct {
		Type string `json:"type"`
		Rows int    `json:"rows"`
		Cols int    `json:"cols"`
	}
	if err := json.Unmarshal(data, &msg); err != nil {
		t.report(ctx, apierror.New(apierror.InvalidArgument, "a text frame must be a JSON control message: {\"type\":\"resize\",\"rows\":R,\"cols\":C}"))
		return
	}
	switch msg.Type {
	case "resize":
		t.queue(ctx, ttyOp{resize: &sandbox.TtySize{Rows: msg.Rows, Cols: msg.Cols}})
	case "close_stdin":
		t.queue(ctx, ttyOp{closeStdin: true})
	default:
		t.report(ctx, apierror.New(apierror.InvalidArgument, "unknown control message type %q (resize, close_stdin)", apierror.Truncate(msg.Type, 32)))
	}
}

// report tells the client (subprotocol only) that something it sent was refused.
func (t *ttySession) report(ctx context.Context, err error) {
	e := apierror.From(err)
	if e.Code == apierror.Internal {
		t.log.Warn("terminal input failed", "err", err)
	}
	if t.control {
		_ = t.sendJSON(ctx, map[string]any{"type": "error", "code": e.Code, "message": e.Message})
	}
}

// ttyOp is input for the exec's stdin (data, then a close when closeStdin), or a resize.
type ttyOp struct {
	data       []byte
	closeStdin bool
	resize     *sandbox.TtySize
}

// Bounds of what waits for the exec: MaxStdinWrite bytes of input, in at most maxTtyOps runs
// of input and resizes.
const maxTtyOps = 64

// queue adds op after what waits for the exec, merged into the last op when it is of the same
// kind (input is appended, a resize replaces the one before it), waiting while there is no
// room; false when ctx ended.
func (t *ttySession) queue(ctx context.Context, op ttyOp) bool {
	for {
		t.inputMu.Lock()
		n := len(t.ops)
		last := n - 1
		merge := n > 0 && ((op.resize == nil) == (t.ops[last].resize == nil)) && !t.ops[last].closeStdin
		if (t.queued == 0 || t.queued+len(op.data) <= execs.MaxStdinWrite) && (merge || n < maxTtyOps) {
			switch {
			case merge && op.resize != nil:
				t.ops[last].resize = op.resize
			case merge:
				t.ops[last].data = append(t.ops[last].data, op.data...)
				t.ops[last].closeStdin = op.closeStdin
			default:
				t.ops = append(t.ops, op)
			}
			t.queued += len(op.data)
			t.inputMu.Unlock()
			notify(t.inputReady)
			return true
		}
		t.inputMu.Unlock()
		select {
		case <-t.inputRoom:
		case <-ctx.Done():
			return false
		}
	}
}

func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// minResizeInterval spaces a socket's resizes: a flood of them costs at most this rate of calls.
const minResizeInterval = 50 * time.Millisecond

// writeInput applies what waits for the exec, in order, one call at a time: input in one stdin
// write per run (a full stdin buffer is waited out, the bytes kept; an exec that takes no more
// input is reported once and later input dropped), resizes at most one per minResizeInterval.
func (t *ttySession) writeInput(ctx context.Context) {
	var lastResize time.Time
	for {
		select {
		case <-t.inputReady:
		case <-ctx.Done():
			return
		}
		t.inputMu.Lock()
		ops := t.ops
		t.ops, t.queued = nil, 0
		t.inputMu.Unlock()
		notify(t.inputRoom)
		for _, op := range ops {
			if op.resize != nil {
				if wait := minResizeInterval - time.Since(lastResize); wait > 0 {
					select {
					case <-time.After(wait):
					case <-ctx.Done():
						return
					}
				}
				lastResize = time.Now()
				if _, err := t.h.svc.ResizeTty(ctx, t.p, t.sandboxID, t.execID, *op.resize); err != nil && ctx.Err() == nil {
					t.report(ctx, err)
				}
				continue
			}
			if t.inputDead || (len(op.data) == 0 && !op.closeStdin) {
				continue
			}
			if !t.writeStdin(ctx, op) {
				return
			}
		}
	}
}

// writeStdin writes one run of input, retrying while the stdin buffer is full; false when ctx
// ended.
func (t *ttySession) writeStdin(ctx context.Context, op ttyOp) bool {
	wait := 20 * time.Millisecond
	for attempt := 0; ; attempt++ {
		_, err := t.h.svc.WriteStdin(ctx, t.p, t.sandboxID, t.execID, op.data, op.closeStdin)
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		code := apierror.CodeOf(err)
		if code != apierror.LimitExceeded && (code != apierror.Unavailable || attempt >= 5) {
			if code == apierror.InvalidState || code == apierror.NotFound {
				t.inputDead = true
			}
			t.report(ctx, err)
			return true
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return false
		}
		wait = min(2*wait, time.Second)
	}
}
