package resolvers

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

const eventsQuery = `subscription($s: ID, $a: String) { sandboxEvents(sandboxId: $s, after: $a) {
	cursor type sandboxId state previousState reason at } }`

func testEvents() []sandbox.Event {
	return []sandbox.Event{
		{Cursor: "1-0", Type: sandbox.EventStateChanged, SandboxID: apitest.SandboxRunning, State: sandbox.Stopping,
			PreviousState: sandbox.Running, Reason: "requested", At: apitest.T0},
		{Cursor: "2-0", Type: sandbox.EventStateChanged, SandboxID: apitest.SandboxRunning, State: sandbox.Stopped,
			PreviousState: sandbox.Stopping, At: apitest.T0.Add(time.Second)},
	}
}

type eventJSON struct {
	Cursor        string  `json:"cursor"`
	Type          string  `json:"type"`
	SandboxID     string  `json:"sandboxId"`
	State         string  `json:"state"`
	PreviousState *string `json:"previousState"`
	Reason        *string `json:"reason"`
	At            string  `json:"at"`
}

func checkEvents(t *testing.T, got []eventJSON) {
	t.Helper()
	if len(got) != 2 {
		t.Fatalf("got %d events, want 2: %+v", len(got), got)
	}
	if g := got[0]; g.Cursor != "1-0" || g.Type != "STATE_CHANGED" || g.SandboxID != apitest.SandboxRunning || g.State != "STOPPING" ||
		g.PreviousState == nil || *g.PreviousState != "RUNNING" || g.Reason == nil || *g.Reason != "requested" ||
		g.At != "2025-01-02T03:04:05Z" {
		t.Errorf("got first event %+v", g)
	}
	if g := got[1]; g.Cursor != "2-0" || g.State != "STOPPED" || g.Reason != nil {
		t.Errorf("got second event %+v, want STOPPED without a reason", g)
	}
}

// ---- WebSocket ----

type wsMsg struct {
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

func wsURL(e *env) string { return "ws" + strings.TrimPrefix(e.srv.URL, "http") + "/graphql" }

func dialWS(ctx context.Context, t *testing.T, e *env, protocol string, header http.Header) *websocket.Conn {
	t.Helper()
	c, resp, err := websocket.Dial(ctx, wsURL(e), &websocket.DialOptions{Subprotocols: []string{protocol}, HTTPHeader: header})
	if err != nil {
		t.Fatalf("dial: %v (response %v)", err, resp)
	}
	t.Cleanup(func() { c.CloseNow() })
	if c.Subprotocol() != protocol {
		t.Fatalf("got subprotocol %q, want %q", c.Subprotocol(), protocol)
	}
	return c
}

func send(ctx context.Context, t *testing.T, c *websocket.Conn, m wsMsg) {
	t.Helper()
	if err := wsjson.Write(ctx, c, m); err != nil {
		t.Fatalf("write %s: %v", m.Type, err)
	}
}

// next reads the next message that is not a keepalive.
func next(ctx context.Context, t *testing.T, c *websocket.Conn) wsMsg {
	t.Helper()
	for {
		var m wsMsg
		if err := wsjson.Read(ctx, c, &m); err != nil {
			t.Fatalf("read: %v", err)
		}
		if m.Type != "ping" && m.Type != "pong" && m.Type != "ka" {
			return m
		}
	}
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func subscribePayload(vars map[string]any) json.RawMessage {
	return mustJSON(map[string]any{"query": eventsQuery, "variables": vars})
}

func eventOf(t *testing.T, m wsMsg) eventJSON {
	t.Helper()
	var p struct {
		Data   struct{ SandboxEvents eventJSON } `json:"data"`
		Errors []any                             `json:"errors"`
	}
	if err := json.Unmarshal(m.Payload, &p); err != nil || len(p.Errors) > 0 {
		t.Fatalf("bad next payload %s (%v)", m.Payload, err)
	}
	return p.Data.SandboxEvents
}

func TestWebsocketSubscription(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	e.fake.SandboxEvents, e.fake.SandboxEventsEnd = testEvents(), true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := dialWS(ctx, t, e, "graphql-transport-ws", nil)

	send(ctx, t, c, wsMsg{Type: "connection_init", Payload: mustJSON(map[string]any{"X-Api-Key": apitest.UserKey})})
	if m := next(ctx, t, c); m.Type != "connection_ack" {
		t.Fatalf("got %s, want connection_ack", m.Type)
	}
	send(ctx, t, c, wsMsg{ID: "1", Type: "subscribe", Payload: subscribePayload(map[string]any{"s": apitest.SandboxRunning, "a": "0-1"})})
	var got []eventJSON
	for {
		m := next(ctx, t, c)
		if m.ID != "1" {
			t.Fatalf("got message for id %q, want 1: %+v", m.ID, m)
		}
		if m.Type == "complete" {
			break
		}
		if m.Type != "next" {
			t.Fatalf("got %s %s, want next", m.Type, m.Payload)
		}
		if brokeOff(m.Payload) {
			got = append(got, eventJSON{Type: "(broke off)"})
			continue
		}
		got = append(got, eventOf(t, m))
	}
	if len(got) == 0 || got[len(got)-1].Type != "(broke off)" {
		t.Fatalf("got %+v, want the stream to end with an UNAVAILABLE error", got)
	}
	checkEvents(t, got[:len(got)-1])
	if p := e.fake.LastPrincipal(); p.Scope() != "acme:web" {
		t.Errorf("got principal %+v, want acme:web", p)
	}
	if c := e.fake.Last("Events"); c.SandboxID != apitest.SandboxRunning || c.After != "0-1" {
		t.Errorf("got Events(%q, %q), want the sandbox id and cursor", c.SandboxID, c.After)
	}
	if err := c.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Errorf("close: %v", err)
	}
}

// A client that completes a subscription ends the service's stream (no goroutine left behind).
func TestWebsocketClientComplete(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	e.fake.SandboxEvents = testEvents()[:1] // then the stream stays open
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := dialWS(ctx, t, e, "graphql-transport-ws", nil)
	send(ctx, t, c, wsMsg{Type: "connection_init", Payload: mustJSON(map[string]any{"headers": map[string]any{"x-api-key": apitest.UserKey}})})
	if m := next(ctx, t, c); m.Type != "connection_ack" {
		t.Fatalf("got %s, want connection_ack", m.Type)
	}
	send(ctx, t, c, wsMsg{ID: "7", Type: "subscribe", Payload: subscribePayload(nil)})
	if m := next(ctx, t, c); m.Type != "next" {
		t.Fatalf("got %s %s, want next", m.Type, m.Payload)
	}
	send(ctx, t, c, wsMsg{ID: "7", Type: "complete"})
	select {
	case <-e.fake.EventsDone():
	case <-ctx.Done():
		t.Fatal("the service's event stream did not end after the client completed")
	}
	c.Close(websocket.StatusNormalClosure, "")
}

func TestWebsocketAuth(t *testing.T) {
	tests := []struct {
		name       string
		header     http.Header
		payload    map[string]any
		wantAck    bool
		wantReason string
	}{
		{name: "key-in-payload", payload: map[string]any{"X-Api-Key": apitest.UserKey}, wantAck: true},
		{name: "apiKey-in-payload", payload: map[string]any{"apiKey": apitest.UserKey}, wantAck: true},
		{name: "platform-scope", payload: map[string]any{"x-api-key": apitest.PlatformKey, "X-Sandbox-Tenant-Id": "t2", "X-Sandbox-Project-Id": "p2"}, wantAck: true},
		{name: "key-in-upgrade-header", header: http.Header{auth.HeaderAPIKey: {apitest.UserKey}}, wantAck: true},
		{name: "no-key", payload: map[string]any{}, wantReason: "UNAUTHENTICATED"},
		{name: "bad-key", payload: map[string]any{"X-Api-Key": "wrong"}, wantReason: "UNAUTHENTICATED: unknown API key"},
		{name: "scope-from-user-key", payload: map[string]any{"X-Api-Key": apitest.UserKey, "X-Sandbox-Tenant-Id": "t2", "X-Sandbox-Project-Id": "p2"},
			wantReason: "PERMISSION_DENIED"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, HandlerOptions{})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c := dialWS(ctx, t, e, "graphql-transport-ws", tt.header)
			send(ctx, t, c, wsMsg{Type: "connection_init", Payload: mustJSON(tt.payload)})
			var m wsMsg
			err := wsjson.Read(ctx, c, &m)
			if tt.wantAck {
				if err != nil || m.Type != "connection_ack" {
					t.Fatalf("got %+v %v, want connection_ack", m, err)
				}
				c.Close(websocket.StatusNormalClosure, "")
				return
			}
			var ce websocket.CloseError
			if !errors.As(err, &ce) {
				t.Fatalf("got %+v %v, want the socket closed", m, err)
			}
			if ce.Code != 4403 || !strings.HasPrefix(ce.Reason, tt.wantReason) {
				t.Errorf("got close %d %q, want 4403 %q", ce.Code, ce.Reason, tt.wantReason)
			}
			if calls := e.fake.Called(); len(calls) != 0 {
				t.Errorf("got service calls %v, want none", calls)
			}
		})
	}
}

func TestWebsocketBadHeaderKeyIs401(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, resp, err := websocket.Dial(ctx, wsURL(e), &websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"},
		HTTPHeader: http.Header{auth.HeaderAPIKey: {"wrong"}}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("got %v (%v), want a 401 before the upgrade", err, resp)
	}
}

func TestWebsocketOrigin(t *testing.T) {
	e := newEnv(t, HandlerOptions{AllowedOrigins: []string{"dashboard.example.com"}})
	tests := []struct {
		origin string
		want   int
	}{
		{"https://evil.example.com", http.StatusForbidden},
		{"https://dashboard.example.com", http.StatusSwitchingProtocols},
	}
	for _, tt := range tests {
		t.Run(strings.TrimPrefix(tt.origin, "https://"), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, resp, err := websocket.Dial(ctx, wsURL(e), &websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"},
				HTTPHeader: http.Header{"Origin": {tt.origin}}})
			if c != nil {
				c.Close(websocket.StatusNormalClosure, "")
			}
			if resp == nil || resp.StatusCode != tt.want {
				t.Errorf("got %v (%v), want status %d", resp, err, tt.want)
			}
		})
	}
}

func TestWebsocketLegacyProtocol(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	e.fake.SandboxEvents, e.fake.SandboxEventsEnd = testEvents(), true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := dialWS(ctx, t, e, "graphql-ws", nil)
	send(ctx, t, c, wsMsg{Type: "connection_init", Payload: mustJSON(map[string]any{"X-Api-Key": apitest.UserKey})})
	if m := next(ctx, t, c); m.Type != "connection_ack" {
		t.Fatalf("got %s, want connection_ack", m.Type)
	}
	send(ctx, t, c, wsMsg{ID: "1", Type: "start", Payload: subscribePayload(nil)})
	var got []eventJSON
	var last wsMsg
	for m := next(ctx, t, c); m.Type != "complete"; m = next(ctx, t, c) {
		if m.Type != "data" {
			t.Fatalf("got %s %s, want data", m.Type, m.Payload)
		}
		if last = m; brokeOff(m.Payload) {
			continue
		}
		got = append(got, eventOf(t, m))
	}
	if !brokeOff(last.Payload) {
		t.Errorf("the stream ended with %s, want an UNAVAILABLE error", last.Payload)
	}
	checkEvents(t, got)
	c.Close(websocket.StatusNormalClosure, "")
}

// ---- SSE ----

func postSSE(t *testing.T, e *env, key, query string) (*http.Response, *bufio.Scanner) {
	t.Helper()
	return postSSEVars(t, e, key, query, nil)
}

// postSSEVars subscribes over SSE; key "" sends none.
func postSSEVars(t *testing.T, e *env, key, query string, vars map[string]any) (*http.Response, *bufio.Scanner) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/graphql",
		strings.NewReader(string(mustJSON(map[string]any{"query": query, "variables": vars}))))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if key != "" {
		req.Header.Set(auth.HeaderAPIKey, key)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp, bufio.NewScanner(resp.Body)
}

// brokeOff reports whether a payload is the last message of a stream that broke off: no data,
// one UNAVAILABLE error with retryAfter (the fake's SandboxEventsEnd ends the service's stream
// as a Redis that failed for good would).
func brokeOff(payload json.RawMessage) bool {
	var p struct {
		Data   json.RawMessage `json:"data"`
		Errors []struct {
			Extensions map[string]any `json:"extensions"`
		} `json:"errors"`
	}
	if json.Unmarshal(payload, &p) != nil || len(p.Errors) != 1 || (len(p.Data) > 0 && string(p.Data) != "null") {
		return false
	}
	return p.Errors[0].Extensions["code"] == "UNAVAILABLE" && p.Errors[0].Extensions["retryAfter"] != nil
}

// untilBrokeOff fails t unless the last payload is a broken-off stream's error, and returns
// the others.
func untilBrokeOff(t *testing.T, data []json.RawMessage) []json.RawMessage {
	t.Helper()
	if len(data) == 0 || !brokeOff(data[len(data)-1]) {
		t.Fatalf("got %s, want the stream to end with an UNAVAILABLE error", data)
	}
	return data[:len(data)-1]
}

// readSSE returns the data of every "next" event until "complete".
func readSSE(t *testing.T, sc *bufio.Scanner) []json.RawMessage {
	t.Helper()
	var out []json.RawMessage
	event := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
			if event == "complete" {
				return out
			}
		case strings.HasPrefix(line, "data: ") && event == "next":
			out = append(out, json.RawMessage(strings.TrimPrefix(line, "data: ")))
		}
	}
	t.Fatalf("the stream ended without event: complete (%v)", sc.Err())
	return nil
}

func TestSSESubscription(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	e.fake.SandboxEvents, e.fake.SandboxEventsEnd = testEvents(), true
	resp, sc := postSSE(t, e, apitest.UserKey, `subscription { sandboxEvents { cursor type sandboxId state previousState reason at } }`)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("got %d %s, want 200 text/event-stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var got []eventJSON
	for _, data := range untilBrokeOff(t, readSSE(t, sc)) {
		got = append(got, eventOf(t, wsMsg{Payload: data}))
	}
	checkEvents(t, got)
	if c := e.fake.Last("Events"); c.SandboxID != "" || c.After != "" {
		t.Errorf("got Events(%q, %q), want the whole project from now", c.SandboxID, c.After)
	}
}

func TestSSEErrors(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	t.Run("no-key", func(t *testing.T) {
		resp, _ := postSSE(t, e, "", `subscription { sandboxEvents { cursor } }`)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("got %d, want 401", resp.StatusCode)
		}
	})
	t.Run("not-found", func(t *testing.T) {
		_, sc := postSSE(t, e, apitest.UserKey, `subscription { sandboxEvents(sandboxId: "sbx_nope") { cursor } }`)
		data := readSSE(t, sc)
		if len(data) != 1 || !strings.Contains(string(data[0]), `"code":"NOT_FOUND"`) {
			t.Errorf("got %s, want one NOT_FOUND error", data)
		}
	})
}

// Streams outlive the server's read and write timeouts.
func TestStreamsOutliveServerTimeouts(t *testing.T) {
	e := newEnvWith(t, HandlerOptions{}, func(s *http.Server) {
		s.ReadTimeout, s.WriteTimeout = 200*time.Millisecond, 200*time.Millisecond
	})
	e.fake.SandboxEvents, e.fake.SandboxEventsEnd, e.fake.SandboxEventsDelay = testEvents(), true, 500*time.Millisecond
	t.Run("websocket", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c := dialWS(ctx, t, e, "graphql-transport-ws", nil)
		send(ctx, t, c, wsMsg{Type: "connection_init", Payload: mustJSON(map[string]any{"X-Api-Key": apitest.UserKey})})
		if m := next(ctx, t, c); m.Type != "connection_ack" {
			t.Fatalf("got %s, want connection_ack", m.Type)
		}
		send(ctx, t, c, wsMsg{ID: "1", Type: "subscribe", Payload: subscribePayload(nil)})
		var got []json.RawMessage
		for m := next(ctx, t, c); m.Type != "complete"; m = next(ctx, t, c) {
			got = append(got, m.Payload)
		}
		var evs []eventJSON
		for _, p := range untilBrokeOff(t, got) {
			evs = append(evs, eventOf(t, wsMsg{Payload: p}))
		}
		checkEvents(t, evs)
		c.Close(websocket.StatusNormalClosure, "")
	})
	t.Run("sse", func(t *testing.T) {
		_, sc := postSSE(t, e, apitest.UserKey, `subscription { sandboxEvents { cursor type sandboxId state previousState reason at } }`)
		var got []eventJSON
		for _, data := range untilBrokeOff(t, readSSE(t, sc)) {
			got = append(got, eventOf(t, wsMsg{Payload: data}))
		}
		checkEvents(t, got)
	})
}

// Closing HandlerOptions.Shutdown ends open streams.
func TestShutdownEndsStreams(t *testing.T) {
	shutdown, endStreams := context.WithCancel(context.Background())
	defer endStreams()
	e := newEnv(t, HandlerOptions{Shutdown: shutdown})
	e.fake.SandboxEvents = testEvents()[:1] // then the streams stay open
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	c := dialWS(ctx, t, e, "graphql-transport-ws", nil)
	send(ctx, t, c, wsMsg{Type: "connection_init", Payload: mustJSON(map[string]any{"X-Api-Key": apitest.UserKey})})
	if m := next(ctx, t, c); m.Type != "connection_ack" {
		t.Fatalf("got %s, want connection_ack", m.Type)
	}
	send(ctx, t, c, wsMsg{ID: "1", Type: "subscribe", Payload: subscribePayload(nil)})
	if m := next(ctx, t, c); m.Type != "next" {
		t.Fatalf("got %s, want next", m.Type)
	}
	_, sc := postSSE(t, e, apitest.UserKey, `subscription { sandboxEvents { cursor } }`)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "data: ") {
	}

	endStreams()
	for {
		var m wsMsg
		err := wsjson.Read(ctx, c, &m)
		if err == nil {
			continue // a keepalive or the subscription's end
		}
		if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
			t.Errorf("got %v, want the socket closed normally", err)
		}
		break
	}
	if data := readSSE(t, sc); len(data) != 0 {
		t.Errorf("got %d more events, want the stream to complete", len(data))
	}
	for range 2 {
		select {
		case <-e.fake.EventsDone():
		case <-ctx.Done():
			t.Fatal("the service's event streams did not end")
		}
	}
}
