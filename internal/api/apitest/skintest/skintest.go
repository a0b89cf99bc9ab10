// Package skintest (test-only) serves the real REST and GraphQL handlers over a fake
// api.Service in-process, for the tests of their clients (the Go client, sandboxctl), behind a
// Cutter that can drop one stream's connection mid-way or answer requests in the handlers'
// place.
package skintest

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"sandboxd/internal/api"
	"sandboxd/internal/api/apitest"
	"sandboxd/internal/rest"
	"sandboxd/resolvers"
)

// Service is the fake the handlers serve: apitest.Fake, or a fake built on it.
type Service interface {
	api.Service
	// WaitStreams waits until every stream the fake served has ended.
	WaitStreams(t testing.TB, d time.Duration)
}

// Start serves /graphql and the REST paths over svc, with apitest's keys, behind a Cutter;
// when the test ends it closes the server and waits for svc's streams to end.
func Start(t testing.TB, svc Service) (*httptest.Server, *Cutter) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	authn := apitest.Authenticator(t)
	mux := http.NewServeMux()
	mux.Handle("/graphql", resolvers.NewHandler(svc, authn, resolvers.HandlerOptions{Logger: log}))
	mux.Handle("/", rest.New(svc, authn, log, nil))
	cut := &Cutter{}
	srv := httptest.NewServer(cut.wrap(mux))
	t.Cleanup(func() {
		srv.Close()
		svc.WaitStreams(t, 5*time.Second)
	})
	return srv, cut
}

// Cutter drops the server side of one stream's connection once it has written a number of
// events: SSE events (counted by their "id: " lines) or graphql-transport-ws "next" messages.
// It cuts once, then lets every later connection through.
type Cutter struct {
	mu    sync.Mutex
	after int // events to let through before the cut; 0: no cut armed
	seen  int
	cuts  int
	hook  func(http.ResponseWriter, *http.Request) bool
}

// Arm makes the next stream be cut after n events.
func (c *Cutter) Arm(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.after, c.seen = n, 0
}

// Count is how many cuts were made.
func (c *Cutter) Count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cuts
}

// Intercept answers the requests hook takes (it answers true) in place of the handlers: a
// server that answers what the fake does not. Nil ends it.
func (c *Cutter) Intercept(hook func(w http.ResponseWriter, r *http.Request) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hook = hook
}

// due counts the events in p and reports whether p holds the one past the armed number.
func (c *Cutter) due(p []byte, marker []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.after == 0 {
		return false
	}
	c.seen += bytes.Count(p, marker)
	if c.seen > c.after {
		c.after = 0
		c.cuts++
		return true
	}
	return false
}

func (c *Cutter) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		hook := c.hook
		c.mu.Unlock()
		if hook != nil && hook(w, r) {
			return
		}
		h.ServeHTTP(&cutWriter{ResponseWriter: w, c: c}, r)
	})
}

type cutWriter struct {
	http.ResponseWriter
	c    *Cutter
	dead bool
}

func (w *cutWriter) Write(p []byte) (int, error) {
	if w.dead {
		return 0, net.ErrClosed
	}
	if w.c.due(p, []byte("id: ")) {
		// Out with what came before, then close the connection under the stream.
		_ = http.NewResponseController(w.ResponseWriter).Flush()
		if conn, _, err := http.NewResponseController(w.ResponseWriter).Hijack(); err == nil {
			conn.Close()
		}
		w.dead = true
		return 0, net.ErrClosed
	}
	return w.ResponseWriter.Write(p)
}

func (w *cutWriter) Flush() {
	if !w.dead {
		_ = http.NewResponseController(w.ResponseWriter).Flush()
	}
}

func (w *cutWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack hands out the connection wrapped so that its writes are counted (WebSocket).
func (w *cutWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	cc := &cutConn{Conn: conn, c: w.c}
	brw.Writer.Reset(cc)
	return cc, brw, nil
}

type cutConn struct {
	net.Conn
	c *Cutter
}

func (c *cutConn) Write(p []byte) (int, error) {
	if c.c.due(p, []byte(`"type":"next"`)) {
		c.Conn.Close()
		return 0, net.ErrClosed
	}
	return c.Conn.Write(p)
}
