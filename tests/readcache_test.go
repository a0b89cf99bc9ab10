package tests

import (
	"net/http"
	"testing"
	"time"

	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

// readBound is how soon another replica must see a write: the read cache's age bound (1 s,
// internal/sandbox's DefaultReadCacheTTL) with room for a loaded machine. Its change notices
// usually make it far sooner.
const readBound = 3 * time.Second

// TestReadCacheAcrossReplicas: two servers on one Redis and state folder. Replica B has the
// sandbox in its read cache; writes on replica A (a label patch, a stop, a destroy) are seen
// by B's REST reads within the bound, and A's own reads see them at once. Another tenant gets
// 404 from both replicas while the sandbox is cached, for a GET, a list and a guessed id.
func TestReadCacheAcrossReplicas(t *testing.T) {
	rs := redistest.Start(t)
	reps := e2e.Replicas(t, rs.URL, 2)
	a, b := reps[0], reps[1]
	h := e2e.HdrTenant1
	id := a.Create(t, e2e.CreateBody, h).SandboxID
	b.Get(t, id, h) // in B's cache now
	a.Get(t, id, h)

	e2e.Step(t, "another-tenant-while-cached", func(t *testing.T) {
		for _, s := range reps {
			s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id, nil, e2e.HdrTenant2).WantError(t, http.StatusNotFound, "NOT_FOUND")
			if _, ok := s.List(t, e2e.HdrTenant2).Find(id); ok {
				t.Errorf("%s: tenant 2's list shows tenant 1's sandbox", s.URL)
			}
		}
	})

	e2e.Step(t, "label-patch-on-a", func(t *testing.T) {
		r := a.Curl(t, http.MethodPatch, e2e.Prefix+"/"+id, []byte(`{"labels":{"cache":"two"}}`), h, e2e.HdrJSON)
		r.Want(t, http.StatusOK)
		if got := labelsOf(t, a, id, h); got["cache"] != "two" {
			t.Fatalf("A's read after its own write: got labels %v, want cache=two at once", got)
		}
		start := time.Now()
		for labelsOf(t, b, id, h)["cache"] != "two" {
			if time.Since(start) > readBound {
				t.Fatalf("replica B still lacks the label %v after the write", time.Since(start))
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("replica B saw the label after %v", time.Since(start))
	})

	e2e.Step(t, "stop-on-a", func(t *testing.T) {
		a.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/stop", nil, h).Want(t, http.StatusOK)
		if got := a.Get(t, id, h); got.State != "STOPPED" {
			t.Fatalf("A's read after its stop: got %s, want STOPPED at once", got.State)
		}
		waitSeen(t, b, id, h, func(sb e2e.SandboxJSON) bool { return sb.State == "STOPPED" })
	})

	e2e.Step(t, "destroy-on-a", func(t *testing.T) {
		a.Curl(t, http.MethodDelete, e2e.Prefix+"/"+id, nil, h).Want(t, http.StatusOK)
		start := time.Now()
		for {
			r := b.Curl(t, http.MethodGet, e2e.Prefix+"/"+id, nil, h)
			if r.Status == http.StatusNotFound {
				t.Logf("B saw the destroy after %v", time.Since(start))
				return
			}
			if time.Since(start) > readBound {
				t.Fatalf("B still answers %d for a sandbox destroyed on A %v ago", r.Status, time.Since(start))
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// waitSeen polls s's GET until ok holds, failing after readBound.
func waitSeen(t *testing.T, s *e2e.Server, id, h string, ok func(e2e.SandboxJSON) bool) {
	t.Helper()
	start := time.Now()
	for {
		sb := s.Get(t, id, h)
		if ok(sb) {
			t.Logf("replica B saw the write after %v", time.Since(start))
			return
		}
		if time.Since(start) > readBound {
			t.Fatalf("replica B still answers %+v %v after the write", sb, time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// labelsOf is a sandbox's labels as s's REST GET answers them.
func labelsOf(t *testing.T, s *e2e.Server, id, h string) map[string]string {
	t.Helper()
	r := s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id, nil, h)
	r.Want(t, http.StatusOK)
	var sb struct {
		Labels map[string]string `json:"labels"`
	}
	r.Decode(t, &sb)
	return sb.Labels
}
