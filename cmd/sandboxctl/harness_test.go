package main

import (
	"bytes"
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sandboxd/client"
	"sandboxd/internal/api/apitest"
	"sandboxd/internal/api/apitest/skintest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is the real REST and GraphQL handlers over the shared fake with an in-memory workspace,
// in-process, behind a cutter that can drop one output stream's connection.
type env struct {
	ws  *apitest.Workspace
	srv *httptest.Server
	cut *skintest.Cutter
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{ws: apitest.NewWorkspace()}
	e.srv, e.cut = skintest.Start(t, e.ws)
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
