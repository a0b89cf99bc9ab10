package ratelimit

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestBurstThenRefused: a full bucket lets Burst requests through, counting Remaining down,
// then refuses with a RetryAfter of at most one request's refill and a 429 error.
func TestBurstThenRefused(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		// One request per second: the refill hands out no request during a try unless the
		// machine stalls for most of a second; a stalled try is made again on a fresh key.
		l := newLimiter(t, srv.Client, Config{RequestsPerSec: 1, Burst: 3})
		var got []int
		var d Decision
		for try := 0; ; try++ {
			if try == 3 {
				t.Fatal("the machine stalled for most of a second in each of 3 tries")
			}
			p := alice
			p.Key = fmt.Sprint("alice-", try)
			start := time.Now()
			got = got[:0]
			for range 3 {
				d := allow(t, l, p)
				if !d.Allowed {
					t.Fatalf("request %d of the burst: got refused, want allowed", len(got)+1)
				}
				got = append(got, d.Remaining)
			}
			d = allow(t, l, p)
			if time.Since(start) < 900*time.Millisecond {
				break
			}
		}
		if fmt.Sprint(got) != "[2 1 0]" {
			t.Fatalf("Remaining: got %v, want [2 1 0]", got)
		}
		if d.Allowed || d.Remaining != 0 || d.Cost != 1 || d.Limit != (Limit{1, 3}) {
			t.Fatalf("4th request: got %+v, want refused, remaining 0, cost 1, limit 1/s burst 3", d)
		}
		if d.RetryAfter <= 0 || d.RetryAfter > time.Second {
			t.Fatalf("RetryAfter: got %v, want in (0, 1s]", d.RetryAfter)
		}
		ae := apierror.From(d.Err())
		if ae.Code != apierror.RateLimited || ae.Code.HTTPStatus() != 429 || ae.RetryAfter != time.Second {
			t.Fatalf("Err: got %v (retry after %v), want RATE_LIMITED, 429, 1s", ae, ae.RetryAfter)
		}
		if want := "rate limit exceeded: this API key may make 1 requests per second (burst 3); retry in 1s"; ae.Message != want {
			t.Fatalf("message: got %q, want %q", ae.Message, want)
		}
		if ae.Details["requests_per_sec"] != 1 || ae.Details["burst"] != 3 {
			t.Fatalf("details: got %v, want requests_per_sec 1, burst 3", ae.Details)
		}
		// Another key has a bucket of its own.
		if d := allow(t, l, bob); !d.Allowed || d.Remaining != 2 {
			t.Fatalf("bob: got %+v, want allowed with 2 remaining", d)
		}
	})
}

// TestRefill on the servers' real clocks: once refused, waiting the RetryAfter given is enough.
func TestRefill(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		l := newLimiter(t, srv.Client, Config{RequestsPerSec: 20, Burst: 2})
		for round := range 3 {
			n, d := drain(t, l, alice, 100)
			if round == 0 && n < 2 {
				t.Fatalf("round %d: got %d allowed, want at least the burst of 2", round, n)
			}
			if d.RetryAfter <= 0 || d.RetryAfter > 50*time.Millisecond {
				t.Fatalf("round %d: RetryAfter got %v, want in (0, 50ms]", round, d.RetryAfter)
			}
			time.Sleep(d.RetryAfter + 5*time.Millisecond)
			if d := allow(t, l, alice); !d.Allowed {
				t.Fatalf("round %d: after waiting RetryAfter: got refused (%+v), want allowed", round, d)
			}
		}
	})
}

// TestRefillExact moves the embedded Redis's clock, which the script reads, by hand.
func TestRefillExact(t *testing.T) {
	mr, rdb := frozen(t)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	l := newLimiter(t, rdb, Config{RequestsPerSec: 4, Burst: 2}) // one request per 250ms
	type step struct {
		at            time.Duration // since t0
		cost          int
		wantAllowed   bool
		wantRemaining int
		wantRetry     time.Duration
	}
	steps := []step{
		{0, 1, true, 1, 0},
		{0, 1, true, 0, 0},
		{0, 1, false, 0, 250 * time.Millisecond},
		{100 * time.Millisecond, 1, false, 0, 150 * time.Millisecond},
		{250 * time.Millisecond, 1, true, 0, 0}, // one request refilled
		{250 * time.Millisecond, 1, false, 0, 250 * time.Millisecond},
		{10 * time.Second, 1, true, 1, 0}, // a long pause fills the bucket, never beyond the burst
		{10 * time.Second, 1, true, 0, 0},
		{10 * time.Second, 1, false, 0, 250 * time.Millisecond},
		{20 * time.Second, 2, true, 0, 0}, // a cost spends that many at once
		{20 * time.Second, 1, false, 0, 250 * time.Millisecond},
		{20*time.Second + 250*time.Millisecond, 2, false, 0, 250 * time.Millisecond}, // one there, two wanted
		{20*time.Second + 500*time.Millisecond, 2, true, 0, 0},
		{30 * time.Second, 0, true, 1, 0}, // a cost below 1 counts as 1
	}
	for i, st := range steps {
		mr.SetTime(t0.Add(st.at))
		d, err := l.Allow(context.Background(), alice, st.cost)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if d.Allowed != st.wantAllowed || d.Remaining != st.wantRemaining {
			t.Fatalf("step %d (at %v, cost %d): got allowed %v, remaining %d, want %v, %d",
				i, st.at, st.cost, d.Allowed, d.Remaining, st.wantAllowed, st.wantRemaining)
		}
		if diff := (d.RetryAfter - st.wantRetry).Abs(); diff > time.Microsecond {
			t.Fatalf("step %d (at %v): RetryAfter got %v, want %v", i, st.at, d.RetryAfter, st.wantRetry)
		}
	}
}

// TestCostAboveBurst: a request that costs more than the whole burst can never pass; it is
// refused without asking Redis, with INVALID_ARGUMENT rather than a Retry-After.
func TestCostAboveBurst(t *testing.T) {
	srv := redistest.Embedded(t)
	l := newLimiter(t, srv.Client, Config{RequestsPerSec: 5, Burst: 10})
	d, err := l.Allow(context.Background(), alice, 11)
	if err != nil || d.Allowed || d.RetryAfter != 0 || d.Cost != 11 {
		t.Fatalf("got %+v, %v, want refused, RetryAfter 0, cost 11, no error", d, err)
	}
	ae := apierror.From(d.Err())
	if ae.Code != apierror.InvalidArgument || ae.RetryAfter != 0 {
		t.Fatalf("Err: got %v, want INVALID_ARGUMENT without RetryAfter", ae)
	}
	if n, _ := srv.Client.DBSize(context.Background()).Result(); n != 0 {
		t.Fatalf("keys in Redis: got %d, want 0", n)
	}
	if d := allow(t, l, alice); !d.Allowed || d.Remaining != 9 {
		t.Fatalf("then cost 1: got %+v, want allowed with 9 remaining", d)
	}
}

// TestSharedBudget: two replicas (two Limiters, each with its own connection pool) on one
// Redis hand out one burst between them, in turn and concurrently.
func TestSharedBudget(t *testing.T) {
	const rate, burst, callers = 1, 20, 60
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		var replicas []*Limiter
		for range 2 {
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			t.Cleanup(func() { rdb.Close() })
			replicas = append(replicas, newLimiter(t, rdb, Config{RequestsPerSec: rate, Burst: burst}))
		}

		t.Run("in-turn", func(t *testing.T) {
			start := time.Now()
			for i := range burst / 2 {
				if d := allow(t, replicas[0], alice); !d.Allowed || d.Remaining != burst-1-i {
					t.Fatalf("replica 0, request %d: got %+v, want allowed with %d remaining", i, d, burst-1-i)
				}
			}
			n, _ := drain(t, replicas[1], alice, 100)
			// The refill adds one request per second while this runs.
			if most := burst/2 + int(time.Since(start).Seconds()*rate); n < burst/2 || n > most {
				t.Fatalf("replica 1 after replica 0 took half: got %d allowed, want %d (at most %d with the refill)", n, burst/2, most)
			}
		})

		t.Run("concurrently", func(t *testing.T) {
			start := time.Now()
			var allowed atomic.Int64
			var wg sync.WaitGroup
			for i := range callers {
				wg.Go(func() {
					d, err := replicas[i%len(replicas)].Allow(context.Background(), bob, 1)
					if err != nil {
						t.Error(err)
					}
					if d.Allowed {
						allowed.Add(1)
					}
				})
			}
			wg.Wait()
			total, most := int(allowed.Load()), burst+int(time.Since(start).Seconds()*rate)
			if total < burst || total > most {
				t.Fatalf("allowed across replicas: got %d, want %d (at most %d with the refill)", total, burst, most)
			}
		})
	})
}

// TestOverridesApplied: each principal's bucket holds the burst of the limit that applies to it.
func TestOverridesApplied(t *testing.T) {
	cfg := Config{
		RequestsPerSec: 1, Burst: 2,
		Keys:    map[string]Limit{"alice": {1, 5}, "platform": {1, 4}},
		Tenants: map[string]Limit{"acme": {1, 3}, "ops": {1, 7}},
	}
	tests := []struct {
		name string
		p    auth.Principal
		want int
	}{
		{"key", alice, 5},
		{"tenant", bob, 3},
		{"default", carol, 2},
		{"platform-key-override", actingFor(platform, "acme", "web"), 4},
	}
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		l := newLimiter(t, srv.Client, cfg)
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				start := time.Now()
				n, d := drain(t, l, tt.p, 50)
				if time.Since(start) < 900*time.Millisecond && n != tt.want {
					t.Fatalf("allowed: got %d, want %d", n, tt.want)
				}
				if d.Limit.Burst != tt.want {
					t.Fatalf("limit: got %v, want burst %d", d.Limit, tt.want)
				}
			})
		}
	})
}

// TestPlatformKeyOwnBucket: a platform key acting for several tenant:projects spends one
// budget, its own; the projects it acts for keep theirs.
func TestPlatformKeyOwnBucket(t *testing.T) {
	_, rdb := frozen(t)
	l := newLimiter(t, rdb, Config{RequestsPerSec: 1, Burst: 2})
	for i, p := range []auth.Principal{actingFor(platform, "acme", "web"), actingFor(platform, "other", "web")} {
		if d := allow(t, l, p); !d.Allowed {
			t.Fatalf("request %d: got refused, want allowed", i)
		}
	}
	if d := allow(t, l, actingFor(platform, "third", "x")); d.Allowed {
		t.Fatal("third project acted for: got allowed, want refused (the key's burst of 2 is spent)")
	}
	if d := allow(t, l, alice); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("alice (acme:web): got %+v, want allowed with 1 remaining", d)
	}
	keys, err := rdb.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	if got, want := fmt.Sprint(keys), "[rate:sbx:rl:key:alice rate:sbx:rl:key:platform]"; got != want {
		t.Fatalf("keys: got %s, want %s", got, want)
	}
}

// TestKeySchema: the bucket's key name and TTL on a real redis-server, as README.md states.
func TestKeySchema(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	l := newLimiter(t, srv.Client, Config{RequestsPerSec: 2, Burst: 10})
	for range 3 {
		allow(t, l, alice)
	}
	keys, err := srv.Client.Keys(ctx, "*").Result()
	if err != nil || fmt.Sprint(keys) != "[rate:sbx:rl:key:alice]" {
		t.Fatalf("keys: got %v, %v, want [rate:sbx:rl:key:alice]", keys, err)
	}
	// Three requests at 2/s take 1.5s to refill: the key lives ceil(1.5s) = 2s.
	if ttl, err := srv.Client.TTL(ctx, keys[0]).Result(); err != nil || ttl <= 0 || ttl > 2*time.Second {
		t.Fatalf("TTL: got %v, %v, want in (0, 2s]", ttl, err)
	}
	if typ, _ := srv.Client.Type(ctx, keys[0]).Result(); typ != "string" {
		t.Fatalf("type: got %s, want string", typ)
	}

	other, err := New(srv.Client, Config{RequestsPerSec: 2, Burst: 10}, Options{Prefix: "elsewhere:"})
	if err != nil {
		t.Fatal(err)
	}
	allow(t, other, alice)
	if n, _ := srv.Client.Exists(ctx, "rate:elsewhere:key:alice").Result(); n != 1 {
		t.Fatal("Options.Prefix: got no rate:elsewhere:key:alice, want it")
	}
}

// TestUnlimited: an unlimited principal never reaches Redis, so even a dead one allows it
// without an error.
func TestUnlimited(t *testing.T) {
	dead := redis.NewClient(&redis.Options{Addr: deadAddr(t), MaxRetries: -1})
	t.Cleanup(func() { dead.Close() })
	cfg := Config{Keys: map[string]Limit{"bob": {1, 1}}, Tenants: map[string]Limit{"other": {}}}
	cfg.RequestsPerSec, cfg.Burst = 0, 0
	l := newLimiter(t, dead, cfg)
	for _, p := range []auth.Principal{alice, carol} {
		for range 100 {
			d, err := l.Allow(context.Background(), p, 1)
			if err != nil || !d.Allowed || !d.Limit.Unlimited() || d.Err() != nil {
				t.Fatalf("%s: got %+v, %v, want allowed, unlimited, no error", p.Key, d, err)
			}
		}
	}
	// bob is limited, so he needs the dead Redis: allowed (fail open) with the error.
	if d, err := l.Allow(context.Background(), bob, 1); err == nil || !d.Allowed {
		t.Fatalf("bob: got %+v, %v, want allowed with an error", d, err)
	}
}
