package main

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/auth"
	"sandboxd/internal/rest"
)

// TestRouteLabels: request metrics are labelled by the pattern of the route that served the
// request, never by an id: the server's mux's own routes, and every route of the REST handler
// behind its "/" (with a key or refused without one); "other" for what no route takes.
func TestRouteLabels(t *testing.T) {
	stub := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	mux := newMux(handlers{ready: stub, metrics: stub, graphql: stub, graphiql: stub, dashboard: stub, ui: stub, openapi: stub,
		rest: rest.New(apitest.New(), apitest.Authenticator(t), slog.New(slog.DiscardHandler), nil)})
	const v1, runs = "/sandbox/sandboxes/v1", "/sandbox/agent/v1/runs"
	tests := []struct {
		method, path, want string
		// rest is set for the REST routes: a request without a key is refused (401) and
		// labelled by its route all the same.
		rest bool
	}{
		{"GET", "/graphql", "/graphql", false},
		{"POST", "/graphql", "/graphql", false},
		{"GET", "/graphiql", "/graphiql", false},
		{"GET", "/", "/{$}", false},
		{"HEAD", "/", "/{$}", false},
		{"GET", "/ui/app-X.js", "/ui/{asset}", false},
		{"GET", "/healthz", "/healthz", false},
		{"GET", "/readyz", "/readyz", false},
		{"GET", "/metrics", "/metrics", false},
		{"GET", "/openapi.json", "/openapi.json", false},

		{"POST", v1, v1, true},
		{"GET", v1, v1, true},
		{"GET", v1 + "/quota", v1 + "/quota", true},
		{"GET", v1 + "/snapshots", v1 + "/snapshots", true},
		{"DELETE", v1 + "/snapshots/snap_1", v1 + "/snapshots/{snapshot_id}", true},
		{"GET", v1 + "/sbx_1", v1 + "/{id}", true},
		{"DELETE", v1 + "/sbx_1", v1 + "/{id}", true},
		{"PATCH", v1 + "/sbx_1", v1 + "/{id}", true},
		{"POST", v1 + "/sbx_1/exec", v1 + "/{id}/exec", true},
		{"GET", v1 + "/sbx_1/execs/exec_1", v1 + "/{id}/execs/{exec_id}", true},
		{"GET", v1 + "/sbx_1/execs/exec_1/output", v1 + "/{id}/execs/{exec_id}/output", true},
		{"GET", v1 + "/sbx_1/execs", v1 + "/{id}/execs", true},
		{"POST", v1 + "/sbx_1/execs/exec_1/signal", v1 + "/{id}/execs/{exec_id}/signal", true},
		{"POST", v1 + "/sbx_1/execs/exec_1/stdin", v1 + "/{id}/execs/{exec_id}/stdin", true},
		{"POST", v1 + "/sbx_1/execs/exec_1/resize", v1 + "/{id}/execs/{exec_id}/resize", true},
		{"GET", v1 + "/sbx_1/execs/exec_1/tty", v1 + "/{id}/execs/{exec_id}/tty", true},
		{"POST", v1 + "/sbx_1/stop", v1 + "/{id}/stop", true},
		{"POST", v1 + "/sbx_1/start", v1 + "/{id}/start", true},
		{"GET", v1 + "/sbx_1/files", v1 + "/{id}/files", true},
		{"PUT", v1 + "/sbx_1/files", v1 + "/{id}/files", true},
		{"POST", v1 + "/sbx_1/files", v1 + "/{id}/files", true},
		{"GET", v1 + "/sbx_1/files/list", v1 + "/{id}/files/list", true},
		{"POST", v1 + "/sbx_1/snapshots", v1 + "/{id}/snapshots", true},
		{"GET", v1 + "/sbx_1/snapshots", v1 + "/{id}/snapshots", true},
		{"POST", runs, runs, true},
		{"GET", runs, runs, true},
		{"GET", runs + "/run_1", runs + "/{run_id}", true},
		{"POST", runs + "/run_1/cancel", runs + "/{run_id}/cancel", true},
		{"GET", runs + "/run_1/events", runs + "/{run_id}/events", true},

		{"GET", v1 + "/snapshots/snap_1/x", "other", false},
		{"GET", v1 + "/sbx_1/nothing", "other", false},
		{"GET", v1 + "/sbx_1/execs/exec_1/nothing", "other", false},
		{"GET", "/favicon.ico", "other", false},
		{"POST", "/", "other", false},
		{"GET", "/ui/", "other", false},
		{"GET", "/ui/a/b.js", "other", false},
		{"GET", runs + "/run_1/x", "other", false},
		{"GET", "/sandbox/agent/v1/runsx", "other", false},
		{"GET", "/sandbox/agent/v1/other", "other", false},
		{"GET", v1 + "//sbx_1", "other", false}, // the server's mux redirects to the clean path
		// A method that no route of a path takes is answered by a catch-all: "other". So is
		// a CORS preflight of a REST path (no REST route takes OPTIONS), not one of /graphql.
		{"PUT", v1 + "/sbx_1", "other", false},
		{"POST", "/healthz", "other", false},
		{"OPTIONS", v1 + "/sbx_1", "other", false},
		{"OPTIONS", "/graphql", "/graphql", false},
	}
	for _, tt := range tests {
		keys := []string{apitest.UserKey}
		if tt.rest {
			keys = append(keys, "")
		}
		for _, key := range keys {
			got, code := observe(t, mux, tt.method, tt.path, key)
			if got != tt.want {
				t.Errorf("%s %s (key %q): got route %q, want %q", tt.method, tt.path, key, got, tt.want)
			}
			if tt.rest && key == "" && code != "401" {
				t.Errorf("%s %s without a key: got code %s, want 401", tt.method, tt.path, code)
			}
		}
	}
}

// observe serves one request through instrument and answers the route and code labels of
// the one observation it made.
func observe(t *testing.T, mux http.Handler, method, path, key string) (route, code string) {
	t.Helper()
	reg := prometheus.NewRegistry()
	req := httptest.NewRequest(method, path, nil)
	if key != "" {
		req.Header.Set(auth.HeaderAPIKey, key)
	}
	instrument(mux, reg).ServeHTTP(httptest.NewRecorder(), req)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("%s %s: got %v, want one observation", method, path, mfs)
	}
	for _, l := range mfs[0].GetMetric()[0].GetLabel() {
		switch l.GetName() {
		case "route":
			route = l.GetValue()
		case "code":
			code = l.GetValue()
		}
	}
	return route, code
}

// TestRoutePattern: a pattern's label is its path; no pattern or a catch-all is "other".
func TestRoutePattern(t *testing.T) {
	for pattern, want := range map[string]string{
		"GET /sandbox/sandboxes/v1/{id}":    "/sandbox/sandboxes/v1/{id}",
		"POST\t /sandbox/agent/v1/runs":     "/sandbox/agent/v1/runs",
		"/graphql":                          "/graphql",
		"GET example.com/healthz":           "/healthz",
		"":                                  "other",
		"/":                                 "other",
		"/sandbox/sandboxes/v1/":            "other",
		"GET /sandbox/sandboxes/v1/{id}/x/": "other",
	} {
		if got := route(pattern); got != want {
			t.Errorf("route(%q) = %q, want %q", pattern, got, want)
		}
	}
}
