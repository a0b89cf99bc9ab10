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
)

// coderWebsocket is gqlgen's WebSocket adapter for github.com/coder/websocket
// (transport.CoderWebsocketImplementation) with one change: a message is written without
// re-encoding its payload. gqlgen hands WriteJSON a struct holding the already encoded response
// as a json.RawMessage, and json.Marshal validates and compacts every raw message byte by byte
// again: for exec output (≤ 64 KiB per event, base64) that pass was a third of sandboxd's CPU.
type coderWebsocket struct {
	acceptOptions websocket.AcceptOptions
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
	return &coderConn{conn: conn}, nil
}

type coderConn struct {
	conn *websocket.Conn

	mu                sync.Mutex
	readDeadlineTimer *time.Timer
	closing           bool
}

var (
	_ transport.WebsocketConn          = (*coderConn)(nil)
	_ transport.WebsocketReadLimiter   = (*coderConn)(nil)
	_ transport.WebsocketReadDeadliner = (*coderConn)(nil)
)

func (c *coderConn) NextReader() (int, io.Reader, error) {
	typ, data, err := c.conn.Read(context.Background())
	if err != nil {
		switch websocket.CloseStatus(err) {
		case websocket.StatusNormalClosure, websocket.StatusNoStatusRcvd:
			return int(typ), nil, transport.ErrWebsocketClosed
		}
		return int(typ), nil, err
	}
	return int(typ), bytes.NewReader(data), nil
}

func (c *coderConn) WriteJSON(v any) error {
	data, err := encodeWSMessage(v)
	if err != nil {
		return err
	}
	return c.conn.Write(context.Background(), websocket.MessageText, data)
}

// encodeWSMessage encodes gqlgen's outgoing message structs ({ID, Type, Payload
// json.RawMessage}, for either subprotocol) field by field, copying the payload as it is;
// anything else goes through json.Marshal.
func encodeWSMessage(v any) ([]byte, error) {
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct {
		return json.Marshal(v)
	}
	if !isWireMessage(rv.Type()) {
		return json.Marshal(v)
	}
	id, typ, payload := rv.FieldByName("ID"), rv.FieldByName("Type"), rv.FieldByName("Payload")
	var typeText string
	if tm, ok := typ.Interface().(encoding.TextMarshaler); ok {
		b, err := tm.MarshalText()
		if err != nil {
			return nil, err
		}
		typeText = string(b)
	} else {
		typeText = typ.String()
	}
	raw := payload.Bytes()
	// The id comes from the client: encoded as JSON, not trusted as is.
	idJSON, err := json.Marshal(id.String())
	if err != nil {
		return nil, err
	}
	typeJSON, err := json.Marshal(typeText)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, 0, len(raw)+len(typeJSON)+len(idJSON)+32)
	buf = append(buf, '{')
	if id.Len() > 0 {
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
	return append(buf, '}'), nil
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
	c.clearReadDeadline()
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
	c.clearReadDeadline()
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

func (c *coderConn) clearReadDeadline() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopReadDeadlineLocked()
}

func (c *coderConn) stopReadDeadlineLocked() {
	if c.readDeadlineTimer != nil {
		c.readDeadlineTimer.Stop()
		c.readDeadlineTimer = nil
	}
}
