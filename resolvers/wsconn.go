package resolvers

import (
	"bytes"
	"context"
	"encoding"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/coder/websocket"

	"sandboxd/internal/apierror"
)

// coderWebsocket is gqlgen's WebSocket adapter for github.com/coder/websocket
// (transport.CoderWebsocketImplementation) with one change: a message is written without
// re-encoding its payload. gqlgen hands WriteJSON a struct holding the already encoded response
// as a json.RawMessage, and json.Marshal validates and compacts every raw message byte by byte
// again: for exec output (≤ 64 KiB per event, base64) that pass was a third of sandboxd's CPU.
type coderWebsocket struct {
	acceptOptions websocket.AcceptOptions
	// maxOps bounds the operations open at once on one connection; 0 means no bound.
	maxOps int
	// initTimeout is how long a connection may go without connection_init.
	initTimeout time.Duration
	// keepAlive is how often an initialised connection gets the subprotocol's keepalive (a
	// graphql-transport-ws ping, a graphql-ws "ka"); 0: never. Each is written within
	// writeTimeout, or the connection closes.
	keepAlive, writeTimeout time.Duration
}

var _ transport.WebsocketImplementation = coderWebsocket{}

func (u coderWebsocket) Accept(w http.ResponseWriter, r *http.Request, options transport.WebsocketAcceptOptions) (transport.WebsocketConn, error) {
	for key, values := range options.ResponseHeader {
		for _, value := range values {
			w.Header().Add(key, value)
		}
	}
	opts := u.acceptOptions
	for _, sp := range options.Subprotocols {
		if !slices.Contains(opts.Subprotocols, sp) {
			opts.Subprotocols = append(opts.Subprotocols, sp)
		}
	}
	conn, err := websocket.Accept(w, r, &opts)
	if err != nil {
		return nil, err
	}
	c := &coderConn{conn: conn, maxOps: u.maxOps, active: map[string]bool{}, raw: rawDataFrom(r.Context()),
		keepAlive: u.keepAlive, writeTimeout: u.writeTimeout}
	c.mu.Lock()
	c.initTimer = time.AfterFunc(u.initTimeout, func() { c.closeWith(wsInitTimedOut, "Connection initialisation timeout") })
	c.mu.Unlock()
	return c, nil
}

// coderConn is one WebSocket. Besides carrying messages it screens the client's messages before
// gqlgen reads them, for what gqlgen's transport does not do as graphql-transport-ws says:
//   - no connection_init within initTimeout: close 4408;
//   - a second connection_init: close 4429;
//   - an operation before connection_init: close 4401;
//   - an operation whose id is still in use: close 4409 (gqlgen would replace the first one's
//     cancel function, leaving it running and impossible to stop);
//   - more than maxOps operations open at once: that operation is answered with an error
//     (LIMIT_EXCEEDED) and never reaches gqlgen.
//
// It also sends the keepalives itself, from a timer: gqlgen's would hold a goroutine and a
// ticker per connection, idle or not (10,000 idle subscriptions are 10,000 connections).
type coderConn struct {
	conn   *websocket.Conn
	maxOps int

	keepAlive, writeTimeout time.Duration

	mu                sync.Mutex
	readDeadlineTimer *time.Timer
	closing           bool
	initTimer         *time.Timer
	initSeen          bool
	// keepAliveTimer sends the next keepalive; armed at connection_init, stopped at close
	// (stopped: never armed again).
	keepAliveTimer *time.Timer
	stopped        bool
	// active are the ids of the operations open: from the client's subscribe (start) until the
	// client's complete (stop) or the server's complete or error.
	active map[string]bool
	// raw is the connection's stashed response data (wsraw.go); nil outside gate.wrap.
	raw *rawData
}

// graphql-transport-ws close codes sent by the connection itself.
const (
	wsUnauthorized  = 4401
	wsInitTimedOut  = 4408
	wsDuplicateID   = 4409
	wsTooManyInits  = 4429
	wsRefuseTimeout = 5 * time.Second
)

// screen looks at one client message before gqlgen does; false means it was handled here
// (answered, or the connection is closing) and gqlgen must not see it.
func (c *coderConn) screen(data []byte) bool {
	var m struct {
		Type string `json:"type"`
		ID   string `json:"id"`
	}
	if json.Unmarshal(data, &m) != nil {
		return true // gqlgen answers malformed messages
	}
	c.mu.Lock()
	switch m.Type {
	case "connection_init":
		if c.initSeen {
			c.mu.Unlock()
			c.closeWith(wsTooManyInits, "Too many initialisation requests")
			return false
		}
		c.initSeen = true
		if c.initTimer != nil {
			c.initTimer.Stop()
		}
		if c.keepAlive > 0 && !c.stopped {
			c.keepAliveTimer = time.AfterFunc(c.keepAlive, c.sendKeepAlive)
		}
	case "subscribe", "start":
		switch {
		case !c.initSeen:
			c.mu.Unlock()
			c.closeWith(wsUnauthorized, "Unauthorized")
			return false
		case c.active[m.ID]:
			c.mu.Unlock()
			c.closeWith(wsDuplicateID, cutUTF8("Subscriber for "+m.ID+" already exists", maxCloseReason))
			return false
		case c.maxOps > 0 && len(c.active) >= c.maxOps:
			c.mu.Unlock()
			c.refuse(m.ID, apierror.New(apierror.LimitExceeded,
				"this connection has %d operations open, the most allowed; complete one first or open another connection", c.maxOps).
				WithDetail("limit_name", "operations_per_connection"))
			return false
		}
		c.active[m.ID] = true
	case "complete", "stop":
		delete(c.active, m.ID)
	}
	c.mu.Unlock()
	return true
}

// Keepalive messages: graphql-transport-ws's ping (the client answers pong; one that does not
// is not cut off: the pings keep proxies from closing idle sockets), legacy graphql-ws's "ka".
var (
	wsPing = []byte(`{"type":"ping"}`)
	wsKa   = []byte(`{"type":"ka"}`)
)

// sendKeepAlive writes one keepalive within writeTimeout and arms the next; a write that fails
// or misses the deadline closes the connection (as any other write's does), and a connection
// closing or closed (its timers stopped) gets none, nor another timer.
func (c *coderConn) sendKeepAlive() {
	c.mu.Lock()
	stopped := c.stopped
	c.mu.Unlock()
	if stopped {
		return
	}
	msg := wsKa
	if c.conn.Subprotocol() == "graphql-transport-ws" {
		msg = wsPing
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.writeTimeout)
	err := c.conn.Write(ctx, websocket.MessageText, msg)
	cancel()
	if err != nil {
		_ = c.Close()
		return
	}
	c.mu.Lock()
	if !c.stopped {
		c.keepAliveTimer.Reset(c.keepAlive)
	}
	c.mu.Unlock()
}

// refuse answers one operation with an error message, in the subprotocol's shape.
func (c *coderConn) refuse(id string, e *apierror.Error) {
	errs := []any{gqlError(e)}
	var payload any = errs
	if c.conn.Subprotocol() != "graphql-transport-ws" {
		payload = errs[0] // legacy graphql-ws: one error object
	}
	msg, err := json.Marshal(map[string]any{"id": id, "type": "error", "payload": payload})
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), wsRefuseTimeout)
	defer cancel()
	_ = c.conn.Write(ctx, websocket.MessageText, msg)
}

// closeWith closes the connection with a close code and reason, without waiting for the
// close handshake.
func (c *coderConn) closeWith(code int, reason string) {
	_ = c.WriteClose(code, reason)
}

var (
	_ transport.WebsocketConn          = (*coderConn)(nil)
	_ transport.WebsocketReadLimiter   = (*coderConn)(nil)
	_ transport.WebsocketReadDeadliner = (*coderConn)(nil)
)

func (c *coderConn) NextReader() (int, io.Reader, error) {
	for {
		typ, data, err := c.conn.Read(context.Background())
		if err != nil {
			switch websocket.CloseStatus(err) {
			case websocket.StatusNormalClosure, websocket.StatusNoStatusRcvd:
				return int(typ), nil, transport.ErrWebsocketClosed
			}
			return int(typ), nil, err
		}
		if c.screen(data) {
			return int(typ), bytes.NewReader(data), nil
		}
		c.mu.Lock()
		closing := c.closing
		c.mu.Unlock()
		if closing {
			return int(typ), nil, transport.ErrWebsocketClosed
		}
	}
}

func (c *coderConn) WriteJSON(v any) error {
	data, id, typ, err := encodeWSMessage(v)
	if err != nil {
		return err
	}
	if c.raw != nil {
		data = c.raw.splice(data)
	}
	if id != "" && (typ == "complete" || typ == "error") {
		c.mu.Lock()
		delete(c.active, id)
		c.mu.Unlock()
	}
	return c.conn.Write(context.Background(), websocket.MessageText, data)
}

// encodeWSMessage encodes gqlgen's outgoing message structs ({ID, Type, Payload
// json.RawMessage}, for either subprotocol) field by field, copying the payload as it is;
// anything else goes through json.Marshal.
// It also returns the message's id and type ("" for other values).
func encodeWSMessage(v any) (data []byte, id, typ string, err error) {
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct || !isWireMessage(rv.Type()) {
		data, err = json.Marshal(v)
		return data, "", "", err
	}
	idField, typeField, payload := rv.FieldByName("ID"), rv.FieldByName("Type"), rv.FieldByName("Payload")
	if tm, ok := typeField.Interface().(encoding.TextMarshaler); ok {
		b, err := tm.MarshalText()
		if err != nil {
			return nil, "", "", err
		}
		typ = string(b)
	} else {
		typ = typeField.String()
	}
	id = idField.String()
	raw := payload.Bytes()
	// The id comes from the client: encoded as JSON, not trusted as is.
	idJSON, err := json.Marshal(id)
	if err != nil {
		return nil, "", "", err
	}
	typeJSON, err := json.Marshal(typ)
	if err != nil {
		return nil, "", "", err
	}
	buf := make([]byte, 0, len(raw)+len(typeJSON)+len(idJSON)+32)
	buf = append(buf, '{')
	if id != "" {
		buf = append(buf, `"id":`...)
		buf = append(buf, idJSON...)
		buf = append(buf, ',')
	}
	buf = append(buf, `"type":`...)
	buf = append(buf, typeJSON...)
	if len(raw) > 0 {
		buf = append(buf, `,"payload":`...)
		buf = append(buf, raw...)
	}
	return append(buf, '}'), id, typ, nil
}

// isWireMessage reports whether t has exactly the exported fields of gqlgen's messages, with
// their JSON tags: ID string `json:"id,omitempty"`, Type (a string kind) `json:"type"` and
// Payload json.RawMessage `json:"payload,omitempty"`.
func isWireMessage(t reflect.Type) bool {
	want := map[string]string{"ID": "id,omitempty", "Type": "type", "Payload": "payload,omitempty"}
	n := 0
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		n++
		if tag, ok := want[f.Name]; !ok || f.Tag.Get("json") != tag {
			return false
		}
		switch f.Name {
		case "ID", "Type":
			if f.Type.Kind() != reflect.String {
				return false
			}
		case "Payload":
			if f.Type != reflect.TypeFor[json.RawMessage]() {
				return false
			}
		}
	}
	return n == 3
}

func (c *coderConn) WriteClose(code int, message string) error {
	c.stopTimers()
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return nil
	}
	c.closing = true
	c.mu.Unlock()
	// The close handshake waits up to 5 s for the peer: not on gqlgen's teardown path.
	go func() { _ = c.conn.Close(websocket.StatusCode(code), message) }()
	return nil
}

func (c *coderConn) Close() error {
	c.stopTimers()
	c.mu.Lock()
	closing := c.closing
	c.mu.Unlock()
	if closing {
		return nil // WriteClose's goroutine closes the connection
	}
	return c.conn.CloseNow()
}

func (c *coderConn) Subprotocol() string { return c.conn.Subprotocol() }

func (c *coderConn) SetReadLimit(limit int64) { c.conn.SetReadLimit(limit) }

func (c *coderConn) SetReadDeadline(deadline time.Time) error {
	c.mu.Lock()
	c.stopReadDeadlineLocked()
	closeNow := false
	if !deadline.IsZero() {
		if d := time.Until(deadline); d <= 0 {
			closeNow = true
		} else {
			c.readDeadlineTimer = time.AfterFunc(d, func() { _ = c.conn.CloseNow() })
		}
	}
	c.mu.Unlock()
	if closeNow {
		return c.conn.CloseNow()
	}
	return nil
}

// stopTimers stops the read deadline's, the init timeout's and the keepalive's timers (the
// connection is closing).
func (c *coderConn) stopTimers() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopReadDeadlineLocked()
	c.stopped = true
	if c.keepAliveTimer != nil {
		c.keepAliveTimer.Stop()
	}
}

func (c *coderConn) stopReadDeadlineLocked() {
	if c.initTimer != nil {
		c.initTimer.Stop()
	}
	if c.readDeadlineTimer != nil {
		c.readDeadlineTimer.Stop()
		c.readDeadlineTimer = nil
	}
}
