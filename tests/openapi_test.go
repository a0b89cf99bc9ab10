package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"sandboxd/tests/e2e"
)

// TestOpenAPIServed: GET /openapi.json answers the OpenAPI 3.1 document without a key (a key,
// even a wrong one, changes nothing), revalidates with its ETag, follows CORS like the REST
// paths, holds nothing of the server's configuration, and a hostile Range header does not
// make it answer more than the document. (Every test's REST traffic is checked against this
// document: tests/e2e/openapi.go.)
func TestOpenAPIServed(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{Extra: map[string]any{
		"graphql": map[string]any{"allowed_origins": []string{"dash.example.test"}},
	}})
	r := s.Curl(t, http.MethodGet, "/openapi.json", nil)
	r.Want(t, http.StatusOK)
	var doc struct {
		OpenAPI string                    `json:"openapi"`
		Paths   map[string]map[string]any `json:"paths"`
	}
	r.Decode(t, &doc)
	ops := 0
	for _, item := range doc.Paths {
		for method := range item {
			if method != "parameters" {
				ops++
			}
		}
	}
	if doc.OpenAPI != "3.1.0" || len(doc.Paths) < 20 || ops < 30 {
		t.Fatalf("got openapi %q with %d paths and %d operations, want 3.1.0 and the whole REST API", doc.OpenAPI, len(doc.Paths), ops)
	}
	etag := r.Header.Get("ETag")
	if etag == "" {
		t.Fatalf("%s: no ETag", r)
	}

	e2e.Step(t, "a-key-changes-nothing", func(t *testing.T) {
		for _, h := range []string{e2e.HdrDev, "X-Api-Key: not-a-key"} {
			got := s.Curl(t, http.MethodGet, "/openapi.json", nil, h)
			if got.Status != http.StatusOK || string(got.Body) != string(r.Body) {
				t.Errorf("with %q: got %d and %d bytes, want 200 and the same document", h, got.Status, len(got.Body))
			}
		}
	})

	e2e.Step(t, "revalidation-and-cors", func(t *testing.T) {
		got := s.Curl(t, http.MethodGet, "/openapi.json", nil, "If-None-Match: "+etag)
		if got.Status != http.StatusNotModified || len(got.Body) != 0 {
			t.Errorf("revalidation: got %d with %d bytes, want 304 and none", got.Status, len(got.Body))
		}
		got = s.Curl(t, http.MethodGet, "/openapi.json", nil, "Origin: https://dash.example.test")
		if got.Header.Get("Access-Control-Allow-Origin") != "https://dash.example.test" {
			t.Errorf("from an allowed origin: got ACAO %q", got.Header.Get("Access-Control-Allow-Origin"))
		}
		got = s.Curl(t, http.MethodGet, "/openapi.json", nil, "Origin: https://evil.example.test")
		if got.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("from another origin: got ACAO %q, want none", got.Header.Get("Access-Control-Allow-Origin"))
		}
	})

	e2e.Step(t, "nothing-of-the-config", func(t *testing.T) {
		// The document is the same static text on every server: none of its keys, tenants,
		// folders or profiles' files.
		for _, secret := range []string{e2e.KeyDev, e2e.KeyTenant1, e2e.KeyTenant2, s.State.Dir, s.State.Checkpoints, "/root/", `"t1"`} {
			if strings.Contains(string(r.Body), secret) {
				t.Errorf("the document holds %q", secret)
			}
		}
	})

	e2e.Step(t, "hostile-requests", func(t *testing.T) {
		// 500 overlapping ranges would be 500 copies of the document: it is answered once.
		ranges := make([]string, 500)
		for i := range ranges {
			ranges[i] = fmt.Sprintf("%d-", i)
		}
		got := s.Curl(t, http.MethodGet, "/openapi.json", nil, "Range: bytes="+strings.Join(ranges, ","))
		if got.Status/100 != 2 || len(got.Body) > len(r.Body) {
			t.Errorf("500 overlapping ranges: got %d with %d bytes, want at most the document's %d", got.Status, len(got.Body), len(r.Body))
		}
		// Other methods are no document: without a key the REST gate refuses them, with one
		// they are no path (the server's plain 404, as for any path outside the APIs).
		s.Curl(t, http.MethodPost, "/openapi.json", []byte(`{}`), e2e.HdrJSON).WantError(t, http.StatusUnauthorized, "UNAUTHENTICATED")
		if got := s.Curl(t, http.MethodDelete, "/openapi.json", nil, e2e.HdrDev); got.Status != http.StatusNotFound {
			t.Errorf("%s: want 404", got)
		}
	})

	var check map[string]any
	if err := json.Unmarshal(r.Body, &check); err != nil || check["components"] == nil {
		t.Errorf("the document has no components (%v)", err)
	}
}
