package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// wsReadLimit bounds one WebSocket message: an execOutput chunk as text and base64 is ~200 KiB.
const wsReadLimit = 8 << 20

type wsMsg struct {
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Subscription is a GraphQL subscription over graphql-transport-ws that survives dropped
// connections. Its query takes the variable $after (String) and passes it to the subscription
// field's after argument, and selects the field's cursor. Each event's cursor is kept; when the
// connection drops (or the server shuts down and closes it), Next redials with backoff and
// subscribes again with after set to the last cursor seen, so the server goes on right after
// it: the caller sees no gap and no event twice. It lives until the server completes it, a
// non-retryable error, the end of the context it was opened with, or Close. Not safe for
// concurrent use.
type Subscription struct {
	c      *Client
	ctx    context.Context
	query  string
	vars   map[string]any
	cursor string
	conn   *websocket.Conn
	op     int // the current operation's id on conn
	done   bool
	// Reconnects counts the connections made after the first.
	Reconnects int
}

// Subscribe opens a subscription and waits until the server took it (connection_ack and the
// subscribe sent). vars["after"], when a string, is the first cursor.
func (c *Client) Subscribe(ctx context.Context, query string, vars map[string]any) (*Subscription, error) {
	s := &Subscription{c: c, ctx: ctx, query: query, vars: maps.Clone(vars)}
	if s.vars == nil {
		s.vars = map[string]any{}
	}
	s.cursor, _ = s.vars["after"].(string)
	if err := s.connect(); err != nil {
		return nil, err
	}
	return s, nil
}

// Cursor is the cursor of the last event answered (or the first after).
func (s *Subscription) Cursor() string { return s.cursor }

// Close unsubscribes and closes the connection.
func (s *Subscription) Close() error {
	s.done = true
	if s.conn == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), time.Second)
	defer cancel()
	_ = s.write(ctx, wsMsg{ID: strconv.Itoa(s.op), Type: "complete"})
	err := s.conn.Close(websocket.StatusNormalClosure, "")
	s.conn = nil
	return err
}

func (s *Subscription) wsURL() string {
	u := s.c.base + GraphQLPath
	if rest, ok := strings.CutPrefix(u, "https"); ok {
		return "wss" + rest
	}
	return "ws" + strings.TrimPrefix(u, "http")
}

// connect dials, authenticates in connection_init and subscribes after the cursor.
func (s *Subscription) connect() error {
	opts := &websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}}
	if s.c.http.Timeout == 0 {
		opts.HTTPClient = s.c.http
	}
	conn, _, err := websocket.Dial(s.ctx, s.wsURL(), opts)
	if err != nil {
		return err
	}
	conn.SetReadLimit(wsReadLimit)
	s.conn = conn
	init := map[string]string{"X-Api-Key": s.c.key}
	if s.c.tenant != "" {
		init["X-Sandbox-Tenant-Id"], init["X-Sandbox-Project-Id"] = s.c.tenant, s.c.project
	}
	payload, _ := json.Marshal(init)
	if err := s.write(s.ctx, wsMsg{Type: "connection_init", Payload: payload}); err != nil {
		return s.drop(err)
	}
	for {
		m, err := s.read()
		if err != nil {
			return s.drop(err)
		}
		if m.Type == "connection_ack" {
			break
		}
	}
	vars := maps.Clone(s.vars)
	if s.cursor != "" {
		vars["after"] = s.cursor
	}
	sub, err := json.Marshal(map[string]any{"query": s.query, "variables": vars})
	if err != nil {
		return s.drop(err)
	}
	s.op++
	if err := s.write(s.ctx, wsMsg{ID: strconv.Itoa(s.op), Type: "subscribe", Payload: sub}); err != nil {
		return s.drop(err)
	}
	return nil
}

// drop closes the connection and answers err as the server's *Error when the close said so.
func (s *Subscription) drop(err error) error {
	if s.conn != nil {
		s.conn.CloseNow()
		s.conn = nil
	}
	if st := websocket.CloseStatus(err); st >= 4400 && st < 4500 {
		var ce websocket.CloseError
		errors.As(err, &ce)
		code, msg, ok := strings.Cut(ce.Reason, ": ")
		if !ok {
			code, msg = "", ce.Reason
		}
		e := &Error{Code: code, Message: msg, Details: map[string]any{"close_code": int(st)}}
		if st == 4429 {
			e.Code = CodeRateLimited
		}
		return e
	}
	return err
}

func (s *Subscription) write(ctx context.Context, m wsMsg) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return s.conn.Write(ctx, websocket.MessageText, b)
}

// read answers the next message that is not a ping or pong, answering pings.
func (s *Subscription) read() (wsMsg, error) {
	for {
		_, b, err := s.conn.Read(s.ctx)
		if err != nil {
			return wsMsg{}, err
		}
		var m wsMsg
		if err := json.Unmarshal(b, &m); err != nil {
			return wsMsg{}, fmt.Errorf("client: decoding a WebSocket message: %w", err)
		}
		switch m.Type {
		case "ping":
			if err := s.write(s.ctx, wsMsg{Type: "pong"}); err != nil {
				return wsMsg{}, err
			}
		case "pong":
		default:
			return m, nil
		}
	}
}

// Next answers the next event: the subscription field's value (data.<field>); io.EOF once the
// server completed the subscription. A GraphQL error is a *Error; one that retrying may cure
// (UNAVAILABLE, LIMIT_EXCEEDED, RATE_LIMITED) is retried like a dropped connection.
func (s *Subscription) Next() (json.RawMessage, error) {
	failures := 0
	for {
		if s.done {
			return nil, io.EOF
		}
		var err error
		if s.conn == nil {
			s.Reconnects++
			err = s.connect()
		}
		var ev json.RawMessage
		if err == nil {
			ev, err = s.event()
		}
		if err == nil {
			if ev == nil {
				s.Close()
				return nil, io.EOF
			}
			return ev, nil
		}
		err = s.drop(err)
		var e *Error
		failures++
		if s.ctx.Err() != nil || (errors.As(err, &e) && !retryable(e)) || failures > s.c.retries {
			s.done = true
			return nil, err
		}
		if err := sleep(s.ctx, s.c.wait(failures, err)); err != nil {
			s.done = true
			return nil, err
		}
	}
}

// event reads messages until the current operation's next event (nil at its complete).
func (s *Subscription) event() (json.RawMessage, error) {
	op := strconv.Itoa(s.op)
	for {
		m, err := s.read()
		if err != nil {
			return nil, err
		}
		if m.ID != op {
			continue
		}
		switch m.Type {
		case "complete":
			return nil, nil
		case "error":
			var errs []gqlError
			if json.Unmarshal(m.Payload, &errs) != nil || len(errs) == 0 {
				return nil, &Error{Message: string(m.Payload)}
			}
			return nil, graphQLError(0, "", errs)
		case "next":
			var p struct {
				Data   map[string]json.RawMessage `json:"data"`
				Errors []gqlError                 `json:"errors"`
			}
			if err := json.Unmarshal(m.Payload, &p); err != nil {
				return nil, fmt.Errorf("client: decoding an event: %w", err)
			}
			if len(p.Errors) > 0 {
				return nil, graphQLError(0, "", p.Errors)
			}
			for _, v := range p.Data { // the one subscription field
				var c struct {
					Cursor string `json:"cursor"`
				}
				if json.Unmarshal(v, &c) == nil && c.Cursor != "" {
					s.cursor = c.Cursor
				}
				return v, nil
			}
			return nil, fmt.Errorf("client: an event without data: %s", m.Payload)
		}
	}
}

// Typed is a Subscription whose events decode into T.
type Typed[T any] struct {
	*Subscription
	conv func(json.RawMessage) (T, error)
}

// Next answers the next event; io.EOF once the subscription completed.
func (t *Typed[T]) Next() (T, error) {
	raw, err := t.Subscription.Next()
	if err != nil {
		var zero T
		return zero, err
	}
	return t.conv(raw)
}

// ExecSummary is an exec's status in GraphQL events (without output).
type ExecSummary struct {
	ExecID     string  `json:"execId"`
	State      string  `json:"state"`
	ExitCode   *int    `json:"exitCode"`
	Signal     *string `json:"signal"`
	TimedOut   bool    `json:"timedOut"`
	DurationMs *int64  `json:"durationMs"`
	Error      *string `json:"error"`
}

const execSummaryFields = `execId state exitCode signal timedOut durationMs error`

// SandboxEvent is one event of sandboxEvents.
type SandboxEvent struct {
	Cursor        string       `json:"cursor"`
	Type          string       `json:"type"` // STATE_CHANGED, EXEC_STARTED, EXEC_ENDED, BOOTSTRAP_PROGRESS
	SandboxID     string       `json:"sandboxId"`
	State         string       `json:"state"`
	PreviousState *string      `json:"previousState"`
	Reason        *string      `json:"reason"`
	At            time.Time    `json:"at"`
	Exec          *ExecSummary `json:"exec"`
	BytesRead     *int64       `json:"bytesRead"`
}

// SandboxEventsQuery is the subscription SubscribeSandboxEvents runs.
const SandboxEventsQuery = `subscription($sandboxId: ID, $after: String) {
  sandboxEvents(sandboxId: $sandboxId, after: $after) {
    cursor type sandboxId state previousState reason at bytesRead exec { ` + execSummaryFields + ` } } }`

// SubscribeSandboxEvents follows the status events of one sandbox, or with sandboxID "" of the
// caller's whole project, after the cursor ("": new events only; until the first event, a
// reconnect also starts with new events).
func (c *Client) SubscribeSandboxEvents(ctx context.Context, sandboxID, after string) (*Typed[SandboxEvent], error) {
	vars := map[string]any{}
	if sandboxID != "" {
		vars["sandboxId"] = sandboxID
	}
	if after != "" {
		vars["after"] = after
	}
	s, err := c.Subscribe(ctx, SandboxEventsQuery, vars)
	if err != nil {
		return nil, err
	}
	return &Typed[SandboxEvent]{Subscription: s, conv: decodeJSON[SandboxEvent]}, nil
}

// OutputEvent is one event of execOutput.
type OutputEvent struct {
	Cursor      string
	Kind        string // CHUNK, TRUNCATED, EXIT
	Stream      string // STDOUT or STDERR (CHUNK)
	Data        []byte // the exact bytes (CHUNK)
	MissedBytes int64  // (TRUNCATED)
	Result      *ExecSummary
}

// ExecOutputQuery is the subscription SubscribeExecOutput runs.
const ExecOutputQuery = `subscription($execId: ID!, $after: String) {
  execOutput(execId: $execId, after: $after) {
    cursor kind stream dataBase64 missedBytes result { ` + execSummaryFields + ` } } }`

// SubscribeExecOutput follows an exec's output after the cursor ("" from the start) until its
// EXIT event, after which Next answers io.EOF.
func (c *Client) SubscribeExecOutput(ctx context.Context, execID, after string) (*Typed[OutputEvent], error) {
	vars := map[string]any{"execId": execID}
	if after != "" {
		vars["after"] = after
	}
	s, err := c.Subscribe(ctx, ExecOutputQuery, vars)
	if err != nil {
		return nil, err
	}
	return &Typed[OutputEvent]{Subscription: s, conv: decodeOutputEvent}, nil
}

func decodeJSON[T any](raw json.RawMessage) (T, error) {
	var v T
	err := json.Unmarshal(raw, &v)
	return v, err
}

func decodeOutputEvent(raw json.RawMessage) (OutputEvent, error) {
	var j struct {
		Cursor      string       `json:"cursor"`
		Kind        string       `json:"kind"`
		Stream      *string      `json:"stream"`
		DataBase64  *string      `json:"dataBase64"`
		MissedBytes *int64       `json:"missedBytes"`
		Result      *ExecSummary `json:"result"`
	}
	if err := json.Unmarshal(raw, &j); err != nil {
		return OutputEvent{}, err
	}
	ev := OutputEvent{Cursor: j.Cursor, Kind: j.Kind, Result: j.Result}
	if j.Stream != nil {
		ev.Stream = *j.Stream
	}
	if j.MissedBytes != nil {
		ev.MissedBytes = *j.MissedBytes
	}
	if j.DataBase64 != nil {
		data, err := base64.StdEncoding.DecodeString(*j.DataBase64)
		if err != nil {
			return OutputEvent{}, err
		}
		ev.Data = data
	}
	return ev, nil
}
