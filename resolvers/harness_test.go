package resolvers

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/auth"
)

// syncBuffer is a log sink safe for the server's goroutines.
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

type env struct {
	fake *apitest.Fake
	srv  *httptest.Server
	logs *syncBuffer
}

func newEnv(t *testing.T, opts HandlerOptions) *env {
	t.Helper()
	return newEnvWith(t, opts, nil)
}

// newEnvWith lets configure adjust the http.Server before it starts.
func newEnvWith(t *testing.T, opts HandlerOptions, configure func(*http.Server)) *env {
	t.Helper()
	e := &env{fake: apitest.New(), logs: &syncBuffer{}}
	opts.Logger = slog.New(slog.NewTextHandler(e.logs, nil))
	mux := http.NewServeMux()
	mux.Handle("/graphql", NewHandler(e.fake, apitest.Authenticator(t), opts))
	e.srv = httptest.NewUnstartedServer(mux)
	if configure != nil {
		configure(e.srv.Config)
	}
	e.srv.Start()
	t.Cleanup(e.srv.Close)
	return e
}

// gqlResponse is a GraphQL response as a client sees it.
type gqlResponse struct {
	Status int
	Data   map[string]json.RawMessage `json:"data"`
	Errors []struct {
		Message    string         `json:"message"`
		Path       []any          `json:"path"`
		Extensions map[string]any `json:"extensions"`
	} `json:"errors"`
	Extensions map[string]json.RawMessage `json:"extensions"`
}

func (r gqlResponse) code(i int) string {
	if i >= len(r.Errors) {
		return ""
	}
	c, _ := r.Errors[i].Extensions["code"].(string)
	return c
}

// post sends a GraphQL request; key "" sends none. extra headers are name, value pairs.
func (e *env) post(t *testing.T, key, query string, vars map[string]any, extra ...string) gqlResponse {
	t.Helper()
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/graphql", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(auth.HeaderAPIKey, key)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header.Set(extra[i], extra[i+1])
	}
	return e.do(t, req)
}

func (e *env) do(t *testing.T, req *http.Request) gqlResponse {
	t.Helper()
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out gqlResponse
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("response is not JSON (status %d): %s", resp.StatusCode, raw)
	}
	out.Status = resp.StatusCode
	return out
}

// field decodes data[name] into v.
// field decodes data.name into v; name may be a dotted path into the answer
// ("stopSandbox.sandbox": a mutation payload's field).
func field(t *testing.T, r gqlResponse, name string, v any) {
	t.Helper()
	root, rest, _ := strings.Cut(name, ".")
	raw, ok := r.Data[root]
	if !ok {
		t.Fatalf("data has no %q: %+v", root, r)
	}
	for rest != "" {
		var key string
		key, rest, _ = strings.Cut(rest, ".")
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil {
			t.Fatalf("data.%s: %v (%s)", name, err, raw)
		}
		if raw, ok = obj[key]; !ok {
			t.Fatalf("data.%s has no %q: %s", root, key, raw)
		}
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("data.%s: %v (%s)", name, err, raw)
	}
}

func noErrors(t *testing.T, r gqlResponse) {
	t.Helper()
	if len(r.Errors) > 0 {
		t.Fatalf("got errors %+v, want none", r.Errors)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}
