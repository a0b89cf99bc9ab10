package tests

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"sandboxd/tests/e2e"
)

// TestRedisFullAnswersStoreFull: when the server's Redis reaches its maxmemory (noeviction, as
// sandboxd runs it), what needs a write answers 503 UNAVAILABLE with reason store_full and a
// Retry-After, never 500 INTERNAL; reads go on; a refused create takes no slot and leaves no
// sandbox; and once Redis has room again everything works as before.
func TestRedisFullAnswersStoreFull(t *testing.T) {
	st := e2e.NewStateDir(t)
	s := e2e.StartServer(t, e2e.ServerOptions{State: st})
	key := e2e.HdrTenant1
	id := s.Create(t, e2e.CreateBody, key).SandboxID
	if out := s.Run(t, id, []string{"echo", "before"}, key); out != "before\n" {
		t.Fatalf("exec before: %q", out)
	}
	before := s.Quota(t, key)

	rdb := redis.NewClient(&redis.Options{Network: "unix", Addr: filepath.Join(st.Dir, "redis", "redis.sock")})
	defer rdb.Close()
	ctx := context.Background()
	max, err := rdb.ConfigGet(ctx, "maxmemory").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := rdb.ConfigSet(ctx, "maxmemory", max["maxmemory"]).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer restore()

	storeFull := func(r *e2e.Response) {
		t.Helper()
		r.WantError(t, http.StatusServiceUnavailable, "UNAVAILABLE", "maxmemory")
		if r.Header.Get("Retry-After") == "" || !strings.Contains(string(r.Body), `"reason":"store_full"`) {
			t.Errorf("%s: want a Retry-After and reason store_full", r)
		}
	}
	storeFull(s.Curl(t, http.MethodPost, e2e.Prefix, []byte(e2e.CreateBody), e2e.HdrJSON, key))
	storeFull(s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/exec", []byte(`{"command":["echo","full"]}`), e2e.HdrJSON, key))
	// Reads need no room.
	if got := s.Get(t, id, key); got.State != "RUNNING" {
		t.Errorf("GET while Redis is full: %s, want RUNNING", got.State)
	}
	if l := s.List(t, key); len(l.Sandboxes) != 1 {
		t.Errorf("list while Redis is full: %d sandboxes, want 1", len(l.Sandboxes))
	}

	restore()
	if q := s.Quota(t, key); q.InUse != before.InUse {
		t.Errorf("after the refused create: in_use %d, want %d as before", q.InUse, before.InUse)
	}
	if l := s.List(t, key); len(l.Sandboxes) != 1 {
		t.Errorf("after the refused create: %d sandboxes, want 1", len(l.Sandboxes))
	}
	if out := s.Run(t, id, []string{"echo", "after"}, key); out != "after\n" {
		t.Fatalf("exec after: %q", out)
	}
	s.Create(t, e2e.CreateBody, key)
}
