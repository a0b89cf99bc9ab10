package resolvers

import (
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"sandboxd/internal/api/apitest"
)

// Keepalives: graphql-transport-ws gets a ping every interval, legacy graphql-ws a "ka"; none
// before connection_init.
func TestKeepAlives(t *testing.T) {
	const interval = 40 * time.Millisecond
	for protocol, want := range map[string]string{"graphql-transport-ws": "ping", "graphql-ws": "ka"} {
		t.Run(protocol, func(t *testing.T) {
			e := newEnv(t, HandlerOptions{KeepAlivePingInterval: interval})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c := dialWS(ctx, t, e, protocol, nil)
			type got struct {
				typ string
				at  time.Time
			}
			msgs := make(chan got, 100)
			go func() {
				defer close(msgs)
				for {
					_, data, err := c.Read(ctx)
					if err != nil {
						return
					}
					var m wsMsg
					if json.Unmarshal(data, &m) != nil {
						t.Errorf("not JSON: %q", data)
						return
					}
					msgs <- got{m.Type, time.Now()}
				}
			}()
			time.Sleep(4 * interval)
			initAt := time.Now()
			send(ctx, t, c, wsMsg{Type: "connection_init", Payload: mustJSON(map[string]any{"X-Api-Key": apitest.UserKey})})
			keepalives := 0
			for keepalives < 4 {
				var m got
				select {
				case m = <-msgs:
				case <-ctx.Done():
					t.Fatalf("after %d keepalives: %v", keepalives, ctx.Err())
				}
				if m.at.Before(initAt) {
					t.Fatalf("got %q before connection_init", m.typ)
				}
				switch m.typ {
				case want:
					keepalives++
				case "connection_ack":
				default:
					t.Fatalf("got %q, want %q or connection_ack", m.typ, want)
				}
			}
			c.Close(websocket.StatusNormalClosure, "")
		})
	}
}

// An idle connection holds two goroutines (its read loop and the one gqlgen ends it with): no
// keepalive goroutine, 10,000 idle subscriptions being 10,000 connections.
func TestIdleConnectionGoroutines(t *testing.T) {
	const conns = 50
	e := newEnv(t, HandlerOptions{KeepAlivePingInterval: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	settled := func() int {
		// Goroutines of connections just made or closed take a moment to start or end.
		n := runtime.NumGoroutine()
		for range 20 {
			time.Sleep(20 * time.Millisecond)
			n = min(n, runtime.NumGoroutine())
		}
		return n
	}
	before := settled()
	for range conns {
		c := dialWS(ctx, t, e, "graphql-transport-ws", nil)
		send(ctx, t, c, wsMsg{Type: "connection_init", Payload: mustJSON(map[string]any{"X-Api-Key": apitest.UserKey})})
		if m := next(ctx, t, c); m.Type != "connection_ack" {
			t.Fatalf("got %s, want connection_ack", m.Type)
		}
		go func() { // the client's reader: takes the keepalives
			for {
				if _, _, err := c.Read(ctx); err != nil {
					return
				}
			}
		}()
	}
	per := float64(settled()-before) / conns
	t.Logf("%.2f goroutines per idle connection (the client's reader included)", per)
	if per > 3.1 {
		t.Errorf("%.2f goroutines per idle connection, want at most 3 (the server's 2, the client's reader)", per)
	}
}

// A WebSocket's read loop does not run on net/http's goroutine for the connection, under the
// server's and the middleware's frames: that goroutine ends once the upgrade is hijacked
// (serveDetached), and the connection goes on serving.
func TestWebSocketServedDetached(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := idleSubscription(ctx, t, e)
	var loops, underServe int
	for _, g := range strings.Split(allStacks(), "\n\n") {
		if strings.Contains(g, "transport.(*wsConnection).run(") {
			loops++
			if strings.Contains(g, "net/http.(*conn).serve(") {
				underServe++
			}
		}
	}
	// (Other tests of the package may run beside this one, with read loops of their own.)
	if loops == 0 || underServe != 0 {
		t.Fatalf("%d read loops, %d of them on net/http's connection goroutine; want 1 or more, none", loops, underServe)
	}
	// The connection still works after the upgrade's handler returned.
	send(ctx, t, c, wsMsg{ID: "2", Type: "subscribe", Payload: mustJSON(map[string]any{"query": eventsQuery})})
	for {
		m := next(ctx, t, c)
		if m.ID == "2" && m.Type == "next" {
			break
		}
	}
	c.Close(websocket.StatusNormalClosure, "")
}

// idleSubscription opens a WebSocket whose events subscription got its one event and then
// stays open and idle.
func idleSubscription(ctx context.Context, t *testing.T, e *env) *websocket.Conn {
	t.Helper()
	e.fake.SandboxEvents = testEvents()[:1]
	c := wsSubscribe(ctx, t, e, eventsQuery, nil)
	if m := next(ctx, t, c); m.Type != "next" {
		t.Fatalf("got %s %s, want next", m.Type, m.Payload)
	}
	return c
}

func allStacks() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

// A subscription whose set-up panics (now off the waiting goroutine's stack) is answered as
// before: an INTERNAL error in its field (gqlgen recovers the resolver's panic), the panic
// logged without its cause reaching the client; the connection and the server go on.
func TestSubscriptionSetUpPanic(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	e.fake.SandboxEvents = testEvents()[:1]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := wsSubscribe(ctx, t, e, eventsQuery, map[string]any{"s": apitest.SandboxPanic})
	m := next(ctx, t, c)
	if m.ID != "1" || m.Type != "next" || !strings.Contains(string(m.Payload), `"INTERNAL"`) || strings.Contains(string(m.Payload), apitest.SecretCause) {
		t.Fatalf("got %s %s, want an INTERNAL error without the cause", m.Type, m.Payload)
	}
	if m := next(ctx, t, c); m.ID != "1" || m.Type != "complete" {
		t.Fatalf("got %s %s %s, want the first subscription's complete", m.ID, m.Type, m.Payload)
	}
	send(ctx, t, c, wsMsg{ID: "2", Type: "subscribe", Payload: mustJSON(map[string]any{"query": eventsQuery})})
	if m := next(ctx, t, c); m.ID != "2" || m.Type != "next" {
		t.Fatalf("got %s %s %s, want the second subscription's next", m.ID, m.Type, m.Payload)
	}
	if !strings.Contains(e.logs.String(), "graphql: panic") {
		t.Errorf("the panic was not logged; logs:\n%s", e.logs.String())
	}
	c.Close(websocket.StatusNormalClosure, "")
}
