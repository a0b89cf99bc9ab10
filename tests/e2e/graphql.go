package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// GQLError is one error of a GraphQL answer.
type GQLError struct {
	Message    string         `json:"message"`
	Path       []any          `json:"path"`
	Extensions map[string]any `json:"extensions"`
}

// Code is the error's extensions.code.
func (e GQLError) Code() string {
	c, _ := e.Extensions["code"].(string)
	return c
}

// GQLResult is a GraphQL answer over HTTP.
type GQLResult struct {
	// Resp is the HTTP exchange.
	Resp   *Response                  `json:"-"`
	Data   map[string]json.RawMessage `json:"data"`
	Errors []GQLError                 `json:"errors"`
}

func (g *GQLResult) String() string { return g.Resp.String() }

// GQL posts a GraphQL operation (application/json) and decodes the answer.
func (s *Server) GQL(t *testing.T, query string, vars map[string]any, headers ...string) *GQLResult {
	t.Helper()
	body := map[string]any{"query": query}
	if vars != nil {
		body["variables"] = vars
	}
	r := s.Curl(t, http.MethodPost, "/graphql", []byte(MustJSON(t, body)), append([]string{HdrJSON, "Accept: application/json"}, headers...)...)
	g := &GQLResult{Resp: r}
	if err := json.Unmarshal(r.Body, g); err != nil {
		t.Fatalf("%s: decoding the GraphQL answer: %v", r, err)
	}
	return g
}

// OK fails the test unless the answer is 200 without errors; it decodes data[field] into v.
func (g *GQLResult) OK(t *testing.T, field string, v any) {
	t.Helper()
	if g.Resp.Status != http.StatusOK || len(g.Errors) > 0 {
		t.Fatalf("%s: got status %d and %d errors, want 200 without errors", g, g.Resp.Status, len(g.Errors))
	}
	raw, ok := g.Dig(field)
	if !ok {
		t.Fatalf("%s: got no data.%s", g, field)
	}
	if v != nil {
		if err := json.Unmarshal(raw, v); err != nil {
			t.Fatalf("%s: decoding data.%s: %v", g, field, err)
		}
	}
}

// WantCode reports (without stopping the test) unless the answer has HTTP status `status`
// (0: any status below 500) and its first error has extensions.code `code` and a message that
// mentions every one of mention.
func (g *GQLResult) WantCode(t *testing.T, status int, code string, mention ...string) {
	t.Helper()
	switch {
	case status != 0 && g.Resp.Status != status:
		t.Errorf("%s: got status %d, want %d", g, g.Resp.Status, status)
		return
	case status == 0 && g.Resp.Status >= 500:
		t.Errorf("%s: got status %d, want an answer below 500", g, g.Resp.Status)
		return
	case len(g.Errors) == 0:
		t.Errorf("%s: got no errors, want %s", g, code)
		return
	}
	e := g.Errors[0]
	if e.Code() != code {
		t.Errorf("%s: got extensions.code %q, want %q", g, e.Code(), code)
	}
	for _, m := range mention {
		if !strings.Contains(strings.ToLower(e.Message), strings.ToLower(m)) {
			t.Errorf("%s: got message %q, want it to mention %q", g, e.Message, m)
		}
	}
}

// Dig is data at a dotted path ("stopSandbox.sandbox": a mutation payload's field), and
// whether the answer has it.
func (g *GQLResult) Dig(path string) (json.RawMessage, bool) {
	root, rest, _ := strings.Cut(path, ".")
	raw, ok := g.Data[root]
	for ok && rest != "" {
		var key string
		key, rest, _ = strings.Cut(rest, ".")
		var obj map[string]json.RawMessage
		if json.Unmarshal(raw, &obj) != nil {
			return nil, false
		}
		raw, ok = obj[key]
	}
	return raw, ok
}
