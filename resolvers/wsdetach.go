package resolvers

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"sync"
)

// serveDetached serves a WebSocket upgrade on a goroutine of its own and returns as soon as the
// connection is hijacked (or the upgrade failed and was answered). net/http's goroutine for the
// connection then ends, and with it the frames of the server, the middleware and the gate
// under which it served the upgrade: the WebSocket's read loop, which lives as long as the
// connection, runs on a stack holding only GraphQL's transport. With 10,000 idle
// subscriptions, each connection's read loop is the largest stack the server keeps.
//
// The connection's context no longer ends with the upgrade request's: it ends when the client
// goes before the upgrade, when ctx's shutdown ends, or when the WebSocket's handler returns.
//
// A panic before the hijack is raised again on net/http's goroutine, which recovers and logs
// it as for any request; one after it (net/http's goroutine is gone) is recovered and logged
// here: a panicking connection never takes the server down.
func serveDetached(next http.Handler, w http.ResponseWriter, r *http.Request, shutdown context.Context, log *slog.Logger) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	stopShutdown := func() bool { return false }
	if shutdown != nil {
		stopShutdown = context.AfterFunc(shutdown, cancel)
	}
	hw := &hijackWatch{ResponseWriter: w, hijacked: make(chan struct{}),
		stopClient: context.AfterFunc(r.Context(), cancel)}
	done := make(chan struct{})
	var panicked any // set before done closes
	r = r.WithContext(ctx)
	go func() {
		defer close(done)
		defer func() {
			p := recover()
			if p == nil {
				return
			}
			select {
			case <-hw.hijacked:
				if p != http.ErrAbortHandler {
					log.ErrorContext(ctx, "graphql: panic serving a WebSocket", "panic", p, "stack", string(debug.Stack()))
				}
			default:
				panicked = p
			}
		}()
		defer cancel()
		defer stopShutdown()
		defer hw.stopClient()
		next.ServeHTTP(hw, r)
	}()
	select {
	case <-hw.hijacked:
	case <-done:
		if panicked != nil {
			panic(panicked)
		}
	}
}

// hijackWatch tells when the connection was hijacked; from then on the upgrade request's
// context, which net/http ends when its handler returns, no longer ends the connection's.
type hijackWatch struct {
	http.ResponseWriter
	stopClient func() bool
	once       sync.Once
	hijacked   chan struct{}
}

func (h *hijackWatch) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err == nil {
		h.stopClient()
		h.once.Do(func() { close(h.hijacked) })
	}
	return conn, brw, err
}

func (h *hijackWatch) Unwrap() http.ResponseWriter { return h.ResponseWriter }
