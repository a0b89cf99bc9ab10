package tests

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

	"sandboxd/tests/e2e"
)

// gqlEventsSub subscribes to one sandbox's status events after a cursor.
const gqlEventsSub = `subscription($id: ID, $after: String) { sandboxEvents(sandboxId: $id, after: $after) {
	cursor type sandboxId state previousState reason at } }`

type eventJSON struct {
	Cursor        string  `json:"cursor"`
	Type          string  `json:"type"`
	SandboxID     string  `json:"sandboxId"`
	State         string  `json:"state"`
	PreviousState *string `json:"previousState"`
	Reason        *string `json:"reason"`
	At            string  `json:"at"`
}

func (e eventJSON) String() string {
	prev := "null"
	if e.PreviousState != nil {
		prev = *e.PreviousState
	}
	return e.Cursor + " " + prev + "→" + e.State
}

// gqlEvent is one result of the subscription (a "next" payload).
type gqlEvent struct {
	Data struct {
		SandboxEvents *eventJSON `json:"sandboxEvents"`
	} `json:"data"`
	Errors []e2e.GQLError `json:"errors"`
}

// TestGraphQLSubscriptions follows a sandbox's status events over WebSocket
// (graphql-transport-ws) and over SSE while REST stops and starts it.
func TestGraphQLSubscriptions(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	id := s.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant1).SandboxID

	e2e.Step(t, "websocket", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c := dialGraphQL(ctx, t, s)
		send(ctx, t, c, wsMsg{Type: "connection_init", Payload: rawJSON(t, map[string]any{"X-Api-Key": e2e.KeyTenant1})})
		if m := nextMsg(ctx, t, c); m.Type != "connection_ack" {
			t.Fatalf("got %s %s, want connection_ack", m.Type, m.Payload)
		}
		send(ctx, t, c, wsMsg{ID: "1", Type: "subscribe", Payload: rawJSON(t, map[string]any{
			"query": gqlEventsSub, "variables": map[string]any{"id": id, "after": "0-0"}})})
		events := func() eventJSON {
			t.Helper()
			m := nextMsg(ctx, t, c)
			if m.ID != "1" || m.Type != "next" {
				t.Fatalf("got %s (id %q) %s, want next for subscription 1", m.Type, m.ID, m.Payload)
			}
			var ev gqlEvent
			if err := json.Unmarshal(m.Payload, &ev); err != nil || len(ev.Errors) > 0 || ev.Data.SandboxEvents == nil {
				t.Fatalf("got payload %s (%v), want an event", m.Payload, err)
			}
			return *ev.Data.SandboxEvents
		}
		// The replay from the start of the stream holds the create; once RUNNING arrives the
		// subscription follows live, so nothing the stop publishes can be missed.
		waitForState(t, events, "RUNNING", "")
		r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/stop", nil, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
		checkStop(t, events, id)
		send(ctx, t, c, wsMsg{ID: "1", Type: "complete"})
		if err := c.Close(websocket.StatusNormalClosure, "done"); err != nil {
			t.Errorf("closing the WebSocket: %v", err)
		}
	})

	t.Run("websocket-bad-key", func(t *testing.T) {
		for name, payload := range map[string]map[string]any{
			"unknown-key":         {"X-Api-Key": "not-a-key-of-this-server"},
			"missing-key":         {},
			"scope-from-user-key": {"X-Api-Key": e2e.KeyTenant2, "X-Sandbox-Tenant-Id": "t1", "X-Sandbox-Project-Id": "p1"},
		} {
			t.Run(name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				c := dialGraphQL(ctx, t, s)
				send(ctx, t, c, wsMsg{Type: "connection_init", Payload: rawJSON(t, payload)})
				var m wsMsg
				err := wsjson.Read(ctx, c, &m)
				var ce websocket.CloseError
				if !errors.As(err, &ce) {
					t.Fatalf("got message %+v (err %v), want the socket closed with 4403", m, err)
				}
				if ce.Code != 4403 {
					t.Errorf("got close code %d %q, want 4403", ce.Code, ce.Reason)
				}
			})
		}
	})

	e2e.Step(t, "sse", func(t *testing.T) {
		r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/start", nil, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
		// curl -N -X POST -H "Accept: text/event-stream" -H "X-Api-Key: …" -d '{"query":…}' $URL/graphql
		stream, closeStream := sse(t, s, e2e.HdrTenant1, map[string]any{"id": id, "after": "0-0"})
		defer closeStream()
		events := func() eventJSON {
			t.Helper()
			select {
			case ev, ok := <-stream:
				if !ok {
					t.Fatal("the SSE stream ended, want more events")
				}
				if len(ev.Errors) > 0 || ev.Data.SandboxEvents == nil {
					t.Fatalf("got %+v, want an event", ev)
				}
				return *ev.Data.SandboxEvents
			case <-time.After(90 * time.Second):
				t.Fatal("no SSE event within 90s")
			}
			return eventJSON{}
		}
		// The replay ends with the start just made: STARTING → RUNNING.
		waitForState(t, events, "RUNNING", "STARTING")
		r = s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/stop", nil, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
		checkStop(t, events, id)
	})

	t.Run("sse-bad-key", func(t *testing.T) {
		body := e2e.MustJSON(t, map[string]any{"query": gqlEventsSub, "variables": map[string]any{"id": id}})
		r := s.Curl(t, http.MethodPost, "/graphql", []byte(body), e2e.HdrJSON, "Accept: text/event-stream", "X-Api-Key: not-a-key-of-this-server")
		if r.Status != http.StatusUnauthorized || !strings.Contains(string(r.Body), "UNAUTHENTICATED") {
			t.Errorf("%s: got status %d, want 401 UNAUTHENTICATED", r, r.Status)
		}
	})
}

// waitForState reads events until one reaches state from previous state prev ("" = any).
func waitForState(t *testing.T, next func() eventJSON, state, prev string) {
	t.Helper()
	var seen []string
	for range 50 {
		ev := next()
		seen = append(seen, ev.String())
		if ev.State == state && (prev == "" || (ev.PreviousState != nil && *ev.PreviousState == prev)) {
			return
		}
	}
	t.Fatalf("got events %v, want one reaching %s", seen, state)
}

// checkStop wants the next two events to be RUNNING→STOPPING and STOPPING→STOPPED of id.
func checkStop(t *testing.T, next func() eventJSON, id string) {
	t.Helper()
	want := [][2]string{{"RUNNING", "STOPPING"}, {"STOPPING", "STOPPED"}}
	for _, w := range want {
		ev := next()
		if ev.SandboxID != id || ev.Type != "STATE_CHANGED" || ev.State != w[1] || ev.PreviousState == nil || *ev.PreviousState != w[0] {
			t.Fatalf("got event %s of %s (type %s), want %s→%s of %s", ev, ev.SandboxID, ev.Type, w[0], w[1], id)
		}
		if ev.Cursor == "" || ev.At == "" {
			t.Errorf("got event %+v, want a cursor and a time", ev)
		}
	}
}

// ---- WebSocket (graphql-transport-ws) ----

type wsMsg struct {
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

func rawJSON(t *testing.T, v any) json.RawMessage { return json.RawMessage(e2e.MustJSON(t, v)) }

func dialGraphQL(ctx context.Context, t *testing.T, s *e2e.Server) *websocket.Conn {
	t.Helper()
	url := "ws://" + s.Addr + "/graphql"
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}})
	if err != nil {
		t.Fatalf("dialing %s: %v (response %v)", url, err, resp)
	}
	t.Cleanup(func() { c.CloseNow() })
	if c.Subprotocol() != "graphql-transport-ws" {
		t.Fatalf("got subprotocol %q, want graphql-transport-ws", c.Subprotocol())
	}
	return c
}

func send(ctx context.Context, t *testing.T, c *websocket.Conn, m wsMsg) {
	t.Helper()
	if err := wsjson.Write(ctx, c, m); err != nil {
		t.Fatalf("writing %s: %v", m.Type, err)
	}
}

// nextMsg reads the next message that is not a ping or pong (answering pings).
func nextMsg(ctx context.Context, t *testing.T, c *websocket.Conn) wsMsg {
	t.Helper()
	for {
		var m wsMsg
		if err := wsjson.Read(ctx, c, &m); err != nil {
			t.Fatalf("reading the WebSocket: %v", err)
		}
		switch m.Type {
		case "ping":
			send(ctx, t, c, wsMsg{Type: "pong"})
		case "pong":
		default:
			return m
		}
	}
}

// ---- SSE ----

// sse posts the events subscription with Accept: text/event-stream and streams its results until
// "complete" or until stop is called.
func sse(t *testing.T, s *e2e.Server, key string, vars map[string]any) (<-chan gqlEvent, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	body := e2e.MustJSON(t, map[string]any{"query": gqlEventsSub, "variables": vars})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/graphql", strings.NewReader(body))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	name, value, _ := strings.Cut(key, ":")
	req.Header.Set(name, strings.TrimSpace(value))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("POST /graphql (SSE): %v", err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body.Close()
		cancel()
		t.Fatalf("POST /graphql (SSE): got %d %s, want 200 text/event-stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	out := make(chan gqlEvent)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		event := ""
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event:"):
				event = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
				if event == "complete" {
					return
				}
			case strings.HasPrefix(line, "data:") && event == "next":
				var ev gqlEvent
				if err := json.Unmarshal([]byte(strings.TrimSpace(strings.TrimPrefix(line, "data:"))), &ev); err != nil {
					ev.Errors = []e2e.GQLError{{Message: "undecodable SSE data: " + line}}
				}
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, func() {
		cancel()
		resp.Body.Close()
		<-done
	}
}
