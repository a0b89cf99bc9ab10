package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sandboxd/client"
	"sandboxd/internal/api/apitest"
	"sandboxd/internal/rest"
	"sandboxd/resolvers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is the real REST and GraphQL handlers over the shared fake with an in-memory workspace,
// in-process, behind a cutter that can drop one output stream's connection.
type env struct {
	ws  *apitest.Workspace
	srv *httptest.Server
	cut *cutter
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{ws: apitest.NewWorkspace(), cut: &cutter{}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	authn := apitest.Authenticator(t)
	mux := http.NewServeMux()
	mux.Handle("/graphql", resolvers.NewHandler(e.ws, authn, resolvers.HandlerOptions{Logger: log}))
	mux.Handle("/", rest.New(e.ws, authn, log, nil))
	e.srv = httptest.NewServer(e.cut.wrap(mux))
	t.Cleanup(func() {
		e.srv.Close()
		e.ws.WaitStreams(t, 5*time.Second)
	})
	return e
}

// result is what one run of sandboxctl printed and its exit code.
type result struct {
	code           int
	stdout, stderr string
}

// run runs sandboxctl with args against the env, the user key in SANDBOX_API_KEY unless
// environ sets it, and stdin.
func (e *env) run(t *testing.T, stdin string, environ map[string]string, args ...string) result {
	t.Helper()
	return e.runCtx(t, context.Background(), stdin, environ, nil, nil, args...)
}

func (e *env) runCtx(t *testing.T, ctx context.Context, stdin string, environ map[string]string, stdout, stderr io.Writer, args ...string) result {
	t.Helper()
	vars := map[string]string{client.EnvGatewayURL: e.srv.URL, client.EnvAPIKey: apitest.UserKey}
	for k, v := range environ {
		vars[k] = v
	}
	var out, errOut bytes.Buffer
	a := &app{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut, getenv: func(k string) string { return vars[k] },
		httpClient: e.srv.Client()}
	if stdout != nil {
		a.stdout = io.MultiWriter(&out, stdout)
	}
	if stderr != nil {
		a.stderr = io.MultiWriter(&errOut, stderr)
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	code := run(ctx, args, a)
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

func (r result) want(t *testing.T, code int) result {
	t.Helper()
	if r.code != code {
		t.Fatalf("got exit code %d, want %d\nstdout: %s\nstderr: %s", r.code, code, r.stdout, r.stderr)
	}
	return r
}

// syncBuffer is a buffer a test reads while sandboxctl writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// cutter drops the connection of the next SSE stream once it has written `after` events
// (counted by their "id: " lines), once.
type cutter struct {
	mu    sync.Mutex
	after int
	seen  int
	cuts  int
	hook  func(http.ResponseWriter, *http.Request) bool
}

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

func (c *cutter) due(p []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.after == 0 {
		return false
	}
	c.seen += bytes.Count(p, []byte("id: "))
	if c.seen > c.after {
		c.after = 0
		c.cuts++
		return true
	}
	return false
}

func (c *cutter) wrap(h http.Handler) http.Handler {
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

// intercept answers the requests hook takes (it answers true) in place of the handlers: a
// server that answers what the fake does not.
func (c *cutter) intercept(hook func(w http.ResponseWriter, r *http.Request) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hook = hook
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
	if w.c.due(p) {
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
