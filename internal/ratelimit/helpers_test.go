package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"sandboxd/internal/auth"
)

var (
	alice    = auth.Principal{Key: "alice", Tenant: "acme", Project: "web"}
	bob      = auth.Principal{Key: "bob", Tenant: "acme", Project: "api"}
	carol    = auth.Principal{Key: "carol", Tenant: "other", Project: "web"}
	platform = auth.Principal{Key: "platform", Tenant: "ops", Project: "main", Platform: true}
)

// actingFor is p after the scope headers made it act for tenant:project.
func actingFor(p auth.Principal, tenant, project string) auth.Principal {
	p.Tenant, p.Project = tenant, project
	return p
}

// frozen starts an embedded Redis whose clock (the script reads TIME) stands still until the
// test moves it.
func frozen(t *testing.T) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	mr := miniredis.NewMiniRedis()
	if err := mr.StartAddr("127.0.0.1:0"); err != nil {
		t.Fatalf("miniredis: %v", err)
	}
	t.Cleanup(mr.Close)
	mr.SetTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return mr, rdb
}

func newLimiter(t *testing.T, rdb redis.UniversalClient, cfg Config) *Limiter {
	t.Helper()
	// The tests that count what a bucket allows measure the bucket, not the deadline: on a
	// loaded 2-core machine under -race a round trip to the embedded Redis took more than the
	// default 200 ms, the limiter failed open and TestSharedBudget saw 23 of 20 allowed. The
	// deadline and failing open have tests of their own (failopen_test.go).
	l, err := New(rdb, cfg, Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return l
}

func allow(t *testing.T, l *Limiter, p auth.Principal) Decision {
	t.Helper()
	d, err := l.Allow(context.Background(), p, 1)
	if err != nil {
		t.Fatalf("Allow(%s): %v", p.Key, err)
	}
	return d
}

// drain spends p's bucket until a refusal and returns how many went ahead and the refusal.
func drain(t *testing.T, l *Limiter, p auth.Principal, atMost int) (int, Decision) {
	t.Helper()
	for n := 0; n < atMost; n++ {
		if d := allow(t, l, p); !d.Allowed {
			return n, d
		}
	}
	t.Fatalf("%s: no refusal in %d requests", p.Key, atMost)
	return 0, Decision{}
}

// deadAddr is a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	mr := miniredis.NewMiniRedis()
	if err := mr.StartAddr("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	addr := mr.Addr()
	mr.Close()
	return addr
}
