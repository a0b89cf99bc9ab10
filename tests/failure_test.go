package tests

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"
)

// TestSandboxDeath: a sandbox of the 64 MiB profile allocates 400 MiB; its gVisor sandbox dies.
// The exec answers an error or a failed result, the sandbox is then FAILED with a reason, exec
// on it is 409, and destroy still works.
func TestSandboxDeath(t *testing.T) {
	s := startServer(t, serverOptions{})
	sb := s.create(t, `{"profile":"tiny"}`, hdrTenant1)
	id := sb.SandboxID
	if sb.Resources.MemoryBytes != 64<<20 {
		t.Errorf("got memory_bytes %d, want 64 MiB", sb.Resources.MemoryBytes)
	}
	s.run(t, id, []string{"true"}, hdrTenant1)

	step(t, "exec-that-kills-the-sandbox", func(t *testing.T) {
		start := time.Now()
		r := s.curl(t, http.MethodPost, prefix+"/"+id+"/exec",
			[]byte(`{"command":["python3","-c","x=bytearray(400<<20); print(len(x))"],"timeout_sec":120}`), hdrJSON, hdrTenant1)
		t.Logf("%s (after %s)", r, time.Since(start).Round(time.Millisecond))
		switch {
		case r.Status == http.StatusOK:
			var res execJSON
			r.decode(t, &res)
			if res.ExitCode == 0 && res.Signal == "" && res.Error == "" {
				t.Fatalf("%s: got a successful exec, want it killed or failed", r)
			}
		case r.Status >= 500 && r.Status != http.StatusServiceUnavailable:
			t.Fatalf("%s: got status %d, want 200 with a failed result or a coded error (409 SANDBOX_FAILED, 503)", r, r.Status)
		default:
			var e apiError
			if err := json.Unmarshal(r.Body, &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
				t.Fatalf("%s: got an error without a code and message, want one", r)
			}
		}
	})

	step(t, "state-failed-with-reason", func(t *testing.T) {
		var last sandboxJSON
		eventually(t, 30*time.Second, "GET reports FAILED", func() (bool, string) {
			last = s.get(t, id, hdrTenant1)
			return last.State == "FAILED", mustJSON(t, last)
		})
		if last.StateReason == "" {
			t.Errorf("got %+v, want a non-empty state_reason", last)
		}
		t.Logf("state_reason: %q", last.StateReason)
		var g gqlSandbox
		s.gql(t, gqlGet, map[string]any{"id": id}, hdrTenant1).ok(t, "sandbox", &g)
		if g.State != "FAILED" || g.StateReason == nil || *g.StateReason == "" {
			t.Errorf("GraphQL sandbox: got %+v, want FAILED with a stateReason", g)
		}
	})

	step(t, "exec-on-failed-is-409", func(t *testing.T) {
		r := s.curl(t, http.MethodPost, prefix+"/"+id+"/exec", []byte(`{"command":["true"]}`), hdrJSON, hdrTenant1)
		r.wantError(t, http.StatusConflict, "INVALID_STATE", "FAILED")
		r = s.curl(t, http.MethodGet, prefix+"/"+id+"/files?path=x", nil, hdrTenant1)
		r.wantError(t, http.StatusConflict, "INVALID_STATE")
	})

	step(t, "destroy", func(t *testing.T) {
		r := s.curl(t, http.MethodDelete, prefix+"/"+id, nil, hdrTenant1)
		r.want(t, http.StatusOK)
		s.curl(t, http.MethodGet, prefix+"/"+id, nil, hdrTenant1).wantError(t, http.StatusNotFound, "NOT_FOUND")
	})
}
