package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
	l, err := New(rdb, cfg, Options{})
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

func TestConfigFor(t *testing.T) {
	cfg := Config{
		RequestsPerSec: 10, Burst: 20,
		Keys: map[string]Limit{"alice": {RequestsPerSec: 100, Burst: 200}, "platform": {}},
		Tenants: map[string]Limit{
			"acme": {RequestsPerSec: 50, Burst: 50},
			"ops":  {RequestsPerSec: 1, Burst: 1},
			"big":  {RequestsPerSec: 500, Burst: 500},
		},
	}
	tests := []struct {
		name string
		cfg  Config
		p    auth.Principal
		want Limit
	}{
		{"key-over-tenant", cfg, alice, Limit{100, 200}},
		{"tenant-over-default", cfg, bob, Limit{50, 50}},
		{"default", cfg, carol, Limit{10, 20}},
		{"key-override-unlimited-over-tenant", cfg, platform, Limit{}},
		{"key-override-follows-the-key-not-the-scope", cfg, actingFor(alice, "other", "x"), Limit{100, 200}},
		{"tenant-override-follows-the-scope-acted-for", cfg, actingFor(bob, "big", "x"), Limit{500, 500}},
		{"zero-config-unlimited", Config{}, alice, Limit{}},
		{"tenant-only", Config{Tenants: map[string]Limit{"acme": {1, 2}}}, bob, Limit{1, 2}},
		{"tenant-only-other-tenant-unlimited", Config{Tenants: map[string]Limit{"acme": {1, 2}}}, carol, Limit{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.cfg.For(tt.p); got != tt.want {
				t.Fatalf("For(%+v): got %v, want %v", tt.p, got, tt.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string // substrings of the error, one per problem; none means valid
	}{
		{"zero", Config{}, nil},
		{"default", Config{RequestsPerSec: 10, Burst: 20}, nil},
		{"burst-below-rate", Config{RequestsPerSec: 10, Burst: 1}, nil},
		{"bounds", Config{RequestsPerSec: MaxRequestsPerSec, Burst: MaxBurst}, nil},
		{"override-unlimited", Config{RequestsPerSec: 1, Burst: 1, Keys: map[string]Limit{"ci": {}}}, nil},
		{"overrides", Config{Keys: map[string]Limit{"ci bot": {5, 5}}, Tenants: map[string]Limit{"acme": {1, 1}}}, nil},
		{"negative-rate", Config{RequestsPerSec: -1, Burst: 1}, []string{"rate_limit: requests_per_sec and burst must not be negative, got -1 and 1"}},
		{"negative-burst", Config{RequestsPerSec: 1, Burst: -1}, []string{"rate_limit: requests_per_sec and burst must not be negative, got 1 and -1"}},
		{"no-burst", Config{RequestsPerSec: 5}, []string{"rate_limit: burst must be at least 1 when requests_per_sec is set"}},
		{"burst-without-rate", Config{Burst: 5}, []string{"rate_limit: burst 5 without requests_per_sec"}},
		{"rate-too-high", Config{RequestsPerSec: MaxRequestsPerSec + 1, Burst: 1}, []string{"rate_limit: requests_per_sec must be at most 10000, got 10001"}},
		{"burst-too-high", Config{RequestsPerSec: 1, Burst: MaxBurst + 1}, []string{"rate_limit: burst must be at most 100000, got 100001"}},
		{"bad-key-override", Config{Keys: map[string]Limit{"ci": {RequestsPerSec: 3}}}, []string{`rate_limit.keys["ci"]: burst must be at least 1`}},
		{"empty-key-name", Config{Keys: map[string]Limit{" ": {1, 1}}}, []string{`rate_limit.keys: " " is not a key name`}},
		{"bad-tenant-override", Config{Tenants: map[string]Limit{"acme": {-2, 0}}}, []string{`rate_limit.tenants["acme"]: requests_per_sec and burst must not be negative`}},
		{"bad-tenant-id", Config{Tenants: map[string]Limit{"acme:web": {1, 1}}}, []string{`rate_limit.tenants: "acme:web" is not a valid tenant id`}},
		{"every-problem", Config{RequestsPerSec: -1, Keys: map[string]Limit{"b": {0, 1}, "a": {1, 0}}, Tenants: map[string]Limit{"": {1, 1}}}, []string{
			"rate_limit: requests_per_sec and burst must not be negative",
			`rate_limit.keys["a"]: burst must be at least 1`,
			`rate_limit.keys["b"]: burst 1 without requests_per_sec`,
			`rate_limit.tenants: "" is not a valid tenant id`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("got %v, want valid", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("got valid, want %q", tt.want)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.want) {
				t.Fatalf("got %d problems %q, want %d", len(lines), lines, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.Contains(lines[i], w) {
					t.Fatalf("problem %d: got %q, want it to contain %q", i, lines[i], w)
				}
			}
		})
	}
}

func TestCheckKeyNames(t *testing.T) {
	cfg := Config{Keys: map[string]Limit{"ci": {1, 1}, "cli": {1, 1}, "SANDBOX_API_KEY": {}}}
	if err := cfg.CheckKeyNames([]string{"SANDBOX_API_KEY", "ci", "cli", "other"}); err != nil {
		t.Fatalf("all known: got %v, want nil", err)
	}
	err := cfg.CheckKeyNames([]string{"ci", "deploy"})
	want := `rate_limit.keys: no API key is named "SANDBOX_API_KEY", "cli" (the keys are ["ci" "deploy"])`
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
}

func TestNew(t *testing.T) {
	srv := redistest.Embedded(t)
	if _, err := New(nil, Config{}, Options{}); err == nil {
		t.Fatal("nil client: got nil error, want one")
	}
	if _, err := New(srv.Client, Config{RequestsPerSec: 1}, Options{}); err == nil || !strings.Contains(err.Error(), "burst must be at least 1") {
		t.Fatalf("invalid config: got %v, want the validation error", err)
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want int
	}{
		{-time.Second, 1},
		{0, 1},
		{time.Nanosecond, 1},
		{999 * time.Millisecond, 1},
		{time.Second, 1},
		{time.Second + time.Nanosecond, 2},
		{1500 * time.Millisecond, 2},
		{2 * time.Second, 2},
		{time.Minute + time.Millisecond, 61},
	}
	for _, tt := range tests {
		t.Run(tt.d.String(), func(t *testing.T) {
			if got := RetryAfterSeconds(tt.d); got != tt.want {
				t.Fatalf("RetryAfterSeconds(%v): got %d, want %d", tt.d, got, tt.want)
			}
		})
	}
}

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
