package client_test

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

	"go.uber.org/goleak"

	"sandboxd/client"
	"sandboxd/internal/api/apitest"
	"sandboxd/internal/rest"
	"sandboxd/resolvers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is the real REST and GraphQL handlers over the shared fake, in-process, behind a cutter
// that can drop a stream's connection mid-way.
type env struct {
	fake *apitest.Fake
	srv  *httptest.Server
	cut  *cutter
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{fake: apitest.New(), cut: &cutter{}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	authn := apitest.Authenticator(t)
	mux := http.NewServeMux()
	mux.Handle("/graphql", resolvers.NewHandler(e.fake, authn, resolvers.HandlerOptions{Logger: log}))
	mux.Handle("/", rest.New(e.fake, authn, log, nil))
	e.srv = httptest.NewServer(e.cut.wrap(mux))
	t.Cleanup(func() {
		e.srv.Close()
		e.fake.WaitStreams(t, 5e9)
	})
	return e
}

func (e *env) client(t *testing.T, opts ...client.Option) *client.Client {
	t.Helper()
	opts = append([]client.Option{client.WithBaseURL(e.srv.URL), client.WithAPIKey(apitest.UserKey),
		client.WithHTTPClient(e.srv.Client()), client.WithReconnect(10e6, 100e6, 5)}, opts...)
	c, err := client.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// cutter drops the server side of one stream's connection once it has written `after`
// events: SSE events (counted by their "id: " lines) or graphql-transport-ws "next" messages.
// It cuts once, then lets every later connection through.
type cutter struct {
	mu    sync.Mutex
	after int // events to let through before the cut; 0: no cut armed
	seen  int
	cuts  int
}

// arm makes the next stream be cut after n events.
func (c *cutter) arm(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.after, c.seen = n, 0
}

func (c *cutter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cuts
}

// due counts the events in p and reports whether p holds the one past the armed number.
func (c *cutter) due(p []byte, marker []byte) bool {
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

func (c *cutter) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&cutWriter{ResponseWriter: w, c: c}, r)
	})
}

type cutWriter struct {
	http.ResponseWriter
	c    *cutter
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
	c *cutter
}

func (c *cutConn) Write(p []byte) (int, error) {
	if c.c.due(p, []byte(`"type":"next"`)) {
		c.Conn.Close()
		return 0, net.ErrClosed
	}
	return c.Conn.Write(p)
}
