package main

import "testing"

// TestRouteLabels: request metrics are labelled by route pattern, never by an id.
func TestRouteLabels(t *testing.T) {
	for path, want := range map[string]string{
		"/graphql":                                    "/graphql",
		"/sandbox/sandboxes/v1":                       "/sandbox/sandboxes/v1",
		"/sandbox/sandboxes/v1/sbx_1":                 "/sandbox/sandboxes/v1/{id}",
		"/sandbox/sandboxes/v1/s/exec":                "/sandbox/sandboxes/v1/{id}/exec",
		"/sandbox/sandboxes/v1/s/files/list":          "/sandbox/sandboxes/v1/{id}/files/list",
		"/sandbox/sandboxes/v1/s/execs/exec_1":        "/sandbox/sandboxes/v1/{id}/execs/{exec_id}",
		"/sandbox/sandboxes/v1/s/execs/exec_1/output": "/sandbox/sandboxes/v1/{id}/execs/{exec_id}/output",
		"/sandbox/sandboxes/v1/quota":                 "/sandbox/sandboxes/v1/quota",
		"/sandbox/sandboxes/v1/s/snapshots":           "/sandbox/sandboxes/v1/{id}/snapshots",
		"/sandbox/sandboxes/v1/snapshots":             "/sandbox/sandboxes/v1/snapshots",
		"/sandbox/sandboxes/v1/snapshots/snap_1":      "/sandbox/sandboxes/v1/snapshots/{snapshot_id}",
		"/sandbox/sandboxes/v1/snapshots/snap_1/x":    "other",
		"/sandbox/sandboxes/v1/s/nothing":             "other",
		"/favicon.ico":                                "other",
		"/sandbox/agent/v1/runs":                      "/sandbox/agent/v1/runs",
		"/sandbox/agent/v1/runs/run_1":                "/sandbox/agent/v1/runs/{run_id}",
		"/sandbox/agent/v1/runs/run_1/cancel":         "/sandbox/agent/v1/runs/{run_id}/cancel",
		"/sandbox/agent/v1/runs/run_1/events":         "/sandbox/agent/v1/runs/{run_id}/events",
		"/sandbox/agent/v1/runs/run_1/x":              "other",
		"/sandbox/agent/v1/runsx":                     "other",
		"/sandbox/agent/v1/other":                     "other",
	} {
		if got := route(path); got != want {
			t.Errorf("route(%q) = %q, want %q", path, got, want)
		}
	}
}
