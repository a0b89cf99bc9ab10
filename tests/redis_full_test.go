package tests

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"sandboxd/tests/e2e"
)

// TestRedisFullAnswersStoreFull: when the server's Redis reaches its maxmemory (noeviction, as
// sandboxd runs it), what needs a write answers 503 UNAVAILABLE with reason store_full and a
// Retry-After, never 500 INTERNAL; reads go on; a refused create takes no slot and leaves no
// sandbox; a command that runs all along (its output unstorable for longer than its follower's
// lease) loses nothing: once Redis has room its whole output is there, and it ended; and
// everything works as before.
func TestRedisFullAnswersStoreFull(t *testing.T) {
	st := e2e.NewStateDir(t)
	s := e2e.StartServer(t, e2e.ServerOptions{State: st, Extra: map[string]any{
		"execs": map[string]any{"follow_lease_sec": 3, "retention_sec": 3600}, "reconcile_interval_ms": 500}})
	key := e2e.HdrTenant1
	id := s.Create(t, e2e.CreateBody, key).SandboxID
	if out := s.Run(t, id, []string{"echo", "before"}, key); out != "before\n" {
		t.Fatalf("exec before: %q", out)
	}
	before := s.Quota(t, key)
	const lines = 60
	running := runDetached(t, s, id, key, "sh", "-c", fmt.Sprintf("for i in $(seq 1 %d); do echo line $i; sleep 0.1; done", lines))
	time.Sleep(500 * time.Millisecond)

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

	// Full for longer than the follower's lease, while the command writes.
	time.Sleep(5 * time.Second)
	restore()
	var want strings.Builder
	for i := 1; i <= lines; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	e2e.Eventually(t, 60*time.Second, "the command's whole output once Redis has room", func() (bool, string) {
		var got execStatusFull
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+running, nil, key).Decode(t, &got)
		ok := got.State == "ENDED" && got.ExitCode != nil && *got.ExitCode == 0 && got.Stdout == want.String() && !got.StdoutTruncated
		return ok, fmt.Sprintf("%s exit %v truncated %v, %d of %d stdout bytes", got.State, got.ExitCode, got.StdoutTruncated, len(got.Stdout), want.Len())
	})
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
