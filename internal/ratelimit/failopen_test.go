package ratelimit

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"sandboxd/internal/redistest"
)

// wantFailOpen checks that a decision failed open: allowed, with the limit that applies, and
// an error naming the key that is (cooldown) or is not ErrCooldown.
func wantFailOpen(t *testing.T, d Decision, err error, lim Limit, cooldown bool) {
	t.Helper()
	if err == nil {
		t.Fatal("got no error, want one")
	}
	if !d.Allowed || d.Limit != lim || d.Remaining != 0 || d.RetryAfter != 0 || d.Err() != nil {
		t.Fatalf("got %+v, want allowed with limit %v", d, lim)
	}
	if !strings.HasPrefix(err.Error(), `ratelimit: key "alice": request allowed (fail open): `) {
		t.Fatalf("error: got %q, want it to name the key and say the request was allowed", err)
	}
	if errors.Is(err, ErrCooldown) != cooldown {
		t.Fatalf("error: got %q, want ErrCooldown %v", err, cooldown)
	}
}

// TestRedisDown: when Redis fails, Allow fails open: the request is allowed and the error is
// returned. The first failure costs at most Timeout; then Redis is not asked during the
// cooldown; then one request asks again, and limiting resumes once Redis answers.
func TestRedisDown(t *testing.T) {
	cfg := Config{RequestsPerSec: 1, Burst: 1}
	lim := Limit{1, 1}
	const timeout = 300 * time.Millisecond
	// A cooldown that the test ends by hand (endCooldown), so that no timing decides which
	// requests ask Redis; TestCooldownEnds checks that it ends by itself.
	opts := Options{Timeout: timeout, Cooldown: time.Hour}
	endCooldown := func(l *Limiter) { l.downUntil.Store(1) }
	// outage checks one failure, then the cooldown, then ends it.
	outage := func(t *testing.T, l *Limiter) {
		t.Helper()
		start := time.Now()
		d, err := l.Allow(context.Background(), alice, 1)
		wantFailOpen(t, d, err, lim, false)
		if !strings.Contains(err.Error(), "(fail open): asking Redis: ") {
			t.Fatalf("error: got %q, want Redis's error", err)
		}
		if took := time.Since(start); took > timeout+time.Second {
			t.Fatalf("first failure took %v, want about the timeout %v at most", took, timeout)
		}
		start = time.Now()
		for range 100 {
			d, err := l.Allow(context.Background(), alice, 1)
			wantFailOpen(t, d, err, lim, true)
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("100 requests in the cooldown took %v, want them answered at once", took)
		}
		endCooldown(l)
	}
	t.Run("redis-server-shut-down", func(t *testing.T) {
		srv := redistest.Start(t)
		l, err := New(srv.Client, cfg, opts)
		if err != nil {
			t.Fatal(err)
		}
		if d := allow(t, l, alice); !d.Allowed {
			t.Fatal("before: got refused, want allowed")
		}
		stop := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
		_ = stop.ShutdownNoSave(context.Background()).Err() // the connection drops: an error is expected
		stop.Close()
		outage(t, l)
		d, err := l.Allow(context.Background(), alice, 1) // after the cooldown: asks again, still down
		wantFailOpen(t, d, err, lim, false)
	})
	t.Run("embedded-closed-and-restarted", func(t *testing.T) {
		mr, rdb := frozen(t)
		l, err := New(rdb, cfg, opts)
		if err != nil {
			t.Fatal(err)
		}
		if d := allow(t, l, alice); !d.Allowed {
			t.Fatal("before: got refused, want allowed")
		}
		mr.Close()
		outage(t, l)
		if err := mr.Restart(); err != nil {
			t.Fatal(err)
		}
		// The bucket survived in memory and the clock stood still: still empty, refused.
		if d := allow(t, l, alice); d.Allowed {
			t.Fatal("after the restart: got allowed, want refused")
		}
		if got := l.downUntil.Load(); got != 0 {
			t.Fatalf("after Redis answered: got down until %d, want 0", got)
		}
	})
	t.Run("nothing-listening", func(t *testing.T) {
		rdb := redis.NewClient(&redis.Options{Addr: deadAddr(t)})
		t.Cleanup(func() { rdb.Close() })
		l, err := New(rdb, cfg, opts)
		if err != nil {
			t.Fatal(err)
		}
		outage(t, l)
	})
	t.Run("hung-with-context-timeouts", func(t *testing.T) {
		// A Redis that accepts and never answers: the client's ContextTimeoutEnabled lets the
		// Timeout end the read.
		rdb := redis.NewClient(&redis.Options{Addr: hungAddr(t), ContextTimeoutEnabled: true})
		t.Cleanup(func() { rdb.Close() })
		l, err := New(rdb, cfg, opts)
		if err != nil {
			t.Fatal(err)
		}
		outage(t, l)
	})
	t.Run("no-cooldown", func(t *testing.T) {
		rdb := redis.NewClient(&redis.Options{Addr: deadAddr(t)})
		t.Cleanup(func() { rdb.Close() })
		l, err := New(rdb, cfg, Options{Timeout: 50 * time.Millisecond, Cooldown: -1})
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			d, err := l.Allow(context.Background(), alice, 1)
			wantFailOpen(t, d, err, lim, false)
		}
	})
	t.Run("cancelled-context-is-not-an-outage", func(t *testing.T) {
		_, rdb := frozen(t)
		l, err := New(rdb, cfg, opts)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		d, err := l.Allow(ctx, alice, 1)
		wantFailOpen(t, d, err, lim, false)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error: got %v, want context.Canceled", err)
		}
		if d := allow(t, l, alice); !d.Allowed { // Redis is asked at once: no cooldown
			t.Fatal("next request: got refused, want allowed")
		}
	})
}

// TestCooldownEnds: the cooldown ends by itself; the next request then asks Redis.
func TestCooldownEnds(t *testing.T) {
	const cooldown = 50 * time.Millisecond
	rdb := redis.NewClient(&redis.Options{Addr: deadAddr(t)})
	t.Cleanup(func() { rdb.Close() })
	l, err := New(rdb, Config{RequestsPerSec: 1, Burst: 1}, Options{Timeout: 50 * time.Millisecond, Cooldown: cooldown})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		_, err := l.Allow(context.Background(), alice, 1)
		if err == nil || errors.Is(err, ErrCooldown) {
			t.Fatalf("got %v, want Redis's error", err)
		}
		time.Sleep(cooldown + 10*time.Millisecond)
	}
}

// TestOneProbe: once the cooldown is over, one request asks Redis while the concurrent others
// keep failing open without waiting for it.
func TestOneProbe(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: hungAddr(t), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	l, err := New(rdb, Config{RequestsPerSec: 1, Burst: 1}, Options{Timeout: 500 * time.Millisecond, Cooldown: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	l.downUntil.Store(time.Now().Add(-time.Second).UnixNano()) // a cooldown that just ended
	const callers = 20
	var asked atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			d, err := l.Allow(context.Background(), alice, 1)
			if !d.Allowed || err == nil {
				t.Errorf("got %+v, %v, want allowed with an error", d, err)
			}
			if !errors.Is(err, ErrCooldown) {
				asked.Add(1)
			}
		})
	}
	wg.Wait()
	if got := asked.Load(); got != 1 {
		t.Fatalf("callers that asked Redis: got %d, want 1", got)
	}
}

// hungAddr is a loopback address that accepts connections and never answers.
func hungAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}
