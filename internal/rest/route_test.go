package rest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"sandboxd/internal/api/apitest"
)

// TestRecordRoute: a request to every route notes that route's pattern, with a key or
// without one (a refused request is labelled by its route too); the NOT_FOUND catch-alls and
// paths that no route takes note nothing; an id never reaches the note.
func TestRecordRoute(t *testing.T) {
	h := newTestHandler(t, apitest.New())
	wildcard := regexp.MustCompile(`\{[a-z_]+\}`)
	if len(h.routes) == 0 {
		t.Fatal("the handler has no routes")
	}
	for pattern := range h.routes {
		method, path, ok := strings.Cut(pattern, " ")
		if !ok || !strings.HasPrefix(path, "/") {
			t.Fatalf("route %q has no method", pattern)
		}
		path = wildcard.ReplaceAllString(path, "id_123")
		for _, key := range []string{apitest.UserKey, ""} {
			ctx, route := RecordRoute(context.Background())
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, routeRequest(t, ctx, method, path, key))
			if got := route(); got != pattern {
				t.Errorf("%s %s (key %q, status %d): got route %q, want %q", method, path, key, rec.Code, got, pattern)
			}
			if strings.Contains(route(), "id_123") {
				t.Errorf("%s %s: the route %q has the id in it", method, path, route())
			}
		}
	}
	for _, tt := range []struct{ method, path string }{
		{http.MethodGet, Prefix + "/id_123/nothing"},
		{http.MethodGet, Prefix + "/snapshots/snap_1/x"},
		{http.MethodPatch, Prefix + "/id_123/stop"},
		{http.MethodPut, Prefix},
		{http.MethodGet, Prefix + "/"},
		{http.MethodGet, AgentPrefix + "/runsx"},
		{http.MethodGet, AgentPrefix + "/runs/run_1/x"},
		{http.MethodGet, AgentPrefix},
		{http.MethodGet, "/favicon.ico"},
	} {
		for _, key := range []string{apitest.UserKey, ""} {
			ctx, route := RecordRoute(context.Background())
			h.ServeHTTP(httptest.NewRecorder(), routeRequest(t, ctx, tt.method, tt.path, key))
			if got := route(); got != "" {
				t.Errorf("%s %s (key %q): got route %q, want none", tt.method, tt.path, key, got)
			}
		}
	}
}

// TestRecordRouteIsOptional: without RecordRoute's context the handler serves as before.
func TestRecordRouteIsOptional(t *testing.T) {
	h := newTestHandler(t, apitest.New())
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, routeRequest(t, context.Background(), http.MethodGet, Prefix+"/quota", apitest.UserKey))
	if rec.Code != http.StatusOK {
		t.Errorf("got %d %s, want 200", rec.Code, rec.Body)
	}
}

// routeRequest is a request with no body (as a server's request has one) and key, if any.
func routeRequest(t *testing.T, ctx context.Context, method, path, key string) *http.Request {
	t.Helper()
	req := newRequest(t, ctx, method, path, nil, "X-Api-Key", key)
	req.Body = http.NoBody
	return req
}
