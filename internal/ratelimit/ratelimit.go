// Package ratelimit limits the request rate of each API key with a token bucket (GCRA) kept in
// Redis, so every replica on one Redis draws on the same budget. The bucket is the key's
// "theoretical arrival time", one string per key, computed by the script of
// github.com/go-redis/redis_rate/v10 against Redis's own clock (TIME): replicas whose clocks
// disagree still share one schedule. Key schema: README.md beside this file.
//
// Which limit applies: the key's override, else its tenant's, else the default; a limit of 0
// requests per second is unlimited and costs no Redis round trip.
//
// When Redis fails, Allow fails open: the request is allowed and the error is returned for the
// caller to log and count. A rate limit guards capacity against a runaway client; it does not
// decide who may do what (internal/auth does) nor how many sandboxes a project holds
// (internal/quota does). Failing closed would make Redis a hard dependency of every request:
// an outage would refuse them all here, under a misleading cause (429 with a Retry-After that
// clients obey and retry on), instead of letting each layer that needs Redis answer UNAVAILABLE
// for itself while the rest goes on. The cost of failing open is that callers go unlimited for
// the length of the outage, which the returned error makes visible. So that an
// outage does not slow every request by the client's dials and retries, a call to Redis is
// bounded (Options.Timeout), and after a failure Allow stops asking for a moment
// (Options.Cooldown), then lets a single request find out whether Redis is back.
package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
)

// Bounds on configured values: far above any sane API limit, low enough that the script's
// floating-point clock (sub-microsecond resolution) stays exact to a hundredth of a request.
const (
	MaxRequestsPerSec = 10_000
	MaxBurst          = 100_000
)

// DefaultPrefix starts every bucket's name (redis_rate puts "rate:" before it).
const DefaultPrefix = "sbx:rl:"

// Limit is a token bucket: RequestsPerSec refill, up to Burst at once. RequestsPerSec 0 means
// unlimited (Burst must then be 0 too).
type Limit struct {
	RequestsPerSec int `json:"requests_per_sec"`
	Burst          int `json:"burst"`
}

// Unlimited reports whether l limits nothing.
func (l Limit) Unlimited() bool { return l.RequestsPerSec == 0 }

func (l Limit) String() string {
	if l.Unlimited() {
		return "unlimited"
	}
	return fmt.Sprintf("%d requests/s, burst %d", l.RequestsPerSec, l.Burst)
}

// Config is the rate_limit section of sandboxd's config: a default for every key, overridden
// per tenant and, above that, per API key (by its name).
type Config struct {
	// RequestsPerSec and Burst are every key's default; 0/absent means unlimited.
	RequestsPerSec int `json:"requests_per_sec"`
	Burst          int `json:"burst"`
	// Keys overrides the limit of an API key, by its name (auth.Key.Name); it wins over Tenants.
	// {requests_per_sec: 0} lifts every limit from that key.
	Keys map[string]Limit `json:"keys,omitempty"`
	// Tenants overrides the limit of the keys acting for a tenant (auth.Principal.Tenant).
	Tenants map[string]Limit `json:"tenants,omitempty"`
}

// For returns the limit that applies to p: its key's override, else its tenant's, else the
// default. The tenant is the one p acts for: a platform key acting for tenant:project through
// the scope headers gets that tenant's override (but its bucket is still its own; see Allow).
func (c Config) For(p auth.Principal) Limit {
	if l, ok := c.Keys[p.Key]; ok {
		return l
	}
	if l, ok := c.Tenants[p.Tenant]; ok {
		return l
	}
	return Limit{RequestsPerSec: c.RequestsPerSec, Burst: c.Burst}
}

// Validate reports every problem of c, one per line, each naming the field.
func (c Config) Validate() error {
	var errs []error
	check := func(where string, l Limit) {
		switch {
		case l.RequestsPerSec < 0 || l.Burst < 0:
			errs = append(errs, fmt.Errorf("%s: requests_per_sec and burst must not be negative, got %d and %d", where, l.RequestsPerSec, l.Burst))
		case l.RequestsPerSec > MaxRequestsPerSec:
			errs = append(errs, fmt.Errorf("%s: requests_per_sec must be at most %d, got %d", where, MaxRequestsPerSec, l.RequestsPerSec))
		case l.Burst > MaxBurst:
			errs = append(errs, fmt.Errorf("%s: burst must be at most %d, got %d", where, MaxBurst, l.Burst))
		case l.RequestsPerSec > 0 && l.Burst < 1:
			errs = append(errs, fmt.Errorf("%s: burst must be at least 1 when requests_per_sec is set (requests_per_sec %d; a burst equal to it is a common choice)", where, l.RequestsPerSec))
		case l.RequestsPerSec == 0 && l.Burst > 0:
			errs = append(errs, fmt.Errorf("%s: burst %d without requests_per_sec: set requests_per_sec too, or drop burst (no requests_per_sec means unlimited)", where, l.Burst))
		}
	}
	check("rate_limit", Limit{RequestsPerSec: c.RequestsPerSec, Burst: c.Burst})
	for _, name := range sortedKeys(c.Keys) {
		if strings.TrimSpace(name) == "" {
			errs = append(errs, fmt.Errorf("rate_limit.keys: %q is not a key name", name))
			continue
		}
		check(fmt.Sprintf("rate_limit.keys[%q]", name), c.Keys[name])
	}
	for _, tenant := range sortedKeys(c.Tenants) {
		if !auth.ValidID(tenant) {
			errs = append(errs, fmt.Errorf("rate_limit.tenants: %q is not a valid tenant id", tenant))
			continue
		}
		check(fmt.Sprintf("rate_limit.tenants[%q]", tenant), c.Tenants[tenant])
	}
	return errors.Join(errs...)
}

// CheckKeyNames reports the entries of Keys that name none of the configured API keys (names:
// every auth.Key.Name, including the development key's). A typo there would silently leave the
// key on the tenant's or the default limit. Tenants are not checked: a platform key may act for
// any tenant.
func (c Config) CheckKeyNames(names []string) error {
	var unknown []string
	for _, name := range sortedKeys(c.Keys) {
		if !slices.Contains(names, name) {
			unknown = append(unknown, fmt.Sprintf("%q", name))
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	known := slices.Clone(names)
	sort.Strings(known)
	return fmt.Errorf("rate_limit.keys: no API key is named %s (the keys are %q)", strings.Join(unknown, ", "), known)
}

func sortedKeys(m map[string]Limit) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Options configure a Limiter. Zero values take the defaults.
type Options struct {
	// Prefix starts the name of every bucket; default DefaultPrefix.
	Prefix string
	// Timeout bounds the Redis round trip of one Allow, as a context deadline; default 200ms,
	// negative means none. The deadline ends go-redis's dials and retries; it ends a read from a
	// Redis that accepted the connection and hangs only when the client has
	// ContextTimeoutEnabled (otherwise its ReadTimeout, 3s by default, does).
	Timeout time.Duration
	// Cooldown: after Redis failed, Allow fails open without asking Redis for this long, then
	// lets one request try it while the others keep failing open until that one succeeds.
	// An outage then slows one request per Cooldown on each replica instead of every limited
	// request. Default 1s; negative means always ask Redis.
	Cooldown time.Duration
}

const (
	defaultTimeout  = 200 * time.Millisecond
	defaultCooldown = time.Second
)

// ErrCooldown is in the error of a decision that failed open without asking Redis, because
// Redis failed less than Options.Cooldown ago. Count such errors; log the others, which say
// what Redis did.
var ErrCooldown = errors.New("not asking Redis: it failed within the cooldown")

// Limiter decides whether a request of an API key may go ahead. It is safe for concurrent use.
type Limiter struct {
	gcra *redis_rate.Limiter
	cfg  Config
	opts Options
	// downUntil is the unix ns until which Allow does not ask Redis, set when Redis failed;
	// 0 while Redis answers. Once past, the caller that swaps in a new deadline is the probe.
	downUntil atomic.Int64
}

// New returns a Limiter on rdb with the limits of cfg, which must be valid.
func New(rdb redis.UniversalClient, cfg Config, opts Options) (*Limiter, error) {
	if rdb == nil {
		return nil, errors.New("ratelimit: no Redis client")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.Timeout == 0 {
		opts.Timeout = defaultTimeout
	}
	if opts.Cooldown == 0 {
		opts.Cooldown = defaultCooldown
	}
	return &Limiter{gcra: redis_rate.NewLimiter(rdb), cfg: cfg, opts: opts}, nil
}

// Decision is the answer of Allow.
type Decision struct {
	// Allowed says whether the request may go ahead. Act on it even when Allow returned an
	// error: that is a Redis failure, and Allowed is then true (fail open).
	Allowed bool
	// Limit is the limit applied; Unlimited() when none applies.
	Limit Limit
	// Cost is what the request was charged (or would have been).
	Cost int
	// Remaining is how many more requests of cost 1 could go ahead right now; 0 when refused,
	// unlimited or unknown (Redis failed).
	Remaining int
	// RetryAfter, when refused, is how long until this request would be allowed; 0 when
	// allowed, and 0 on a refusal that no wait can cure (Cost above the burst).
	RetryAfter time.Duration
}

// Err is the error to give the client for a refused decision, nil for an allowed one:
// RATE_LIMITED (429) with RetryAfter rounded up to whole seconds and details
// requests_per_sec and burst; or INVALID_ARGUMENT when the request costs more than the whole
// burst and so could never pass.
func (d Decision) Err() error {
	if d.Allowed {
		return nil
	}
	if d.Cost > d.Limit.Burst {
		return apierror.New(apierror.InvalidArgument,
			"this request costs %d requests but this API key's burst is %d: split it into smaller requests", d.Cost, d.Limit.Burst).
			WithDetail("requests_per_sec", d.Limit.RequestsPerSec).WithDetail("burst", d.Limit.Burst)
	}
	secs := RetryAfterSeconds(d.RetryAfter)
	return apierror.New(apierror.RateLimited,
		"rate limit exceeded: this API key may make %d requests per second (burst %d); retry in %ds",
		d.Limit.RequestsPerSec, d.Limit.Burst, secs).
		WithRetryAfter(time.Duration(secs)*time.Second).
		WithDetail("requests_per_sec", d.Limit.RequestsPerSec).WithDetail("burst", d.Limit.Burst)
}

// Allow charges cost requests (below 1 counts as 1) to p's bucket and says whether the request
// may go ahead. The bucket is p's API key (p.Key), never the tenant:project it acts for: a
// platform key acting for another tenant:project through the scope headers spends its own
// budget, whichever project it acts for (the limit, though, follows Config.For, so a tenant
// override of the project it acts for applies). Keys sharing a name share a bucket.
//
// An unlimited principal is allowed without a Redis round trip. A request costing more than
// the burst is refused without one too (RetryAfter 0, no error). Allow returns an error only
// when it could not ask Redis: Redis failed or timed out (Options.Timeout), it failed within
// the cooldown (ErrCooldown), or ctx ended; the decision is then Allowed (fail open) and the
// caller logs or counts the error.
func (l *Limiter) Allow(ctx context.Context, p auth.Principal, cost int) (Decision, error) {
	lim := l.cfg.For(p)
	d := Decision{Allowed: true, Limit: lim, Cost: max(cost, 1)}
	if lim.Unlimited() {
		return d, nil
	}
	if d.Cost > lim.Burst {
		d.Allowed = false
		return d, nil
	}
	res, err := l.ask(ctx, p.Key, lim, d.Cost)
	if err != nil {
		return d, fmt.Errorf("ratelimit: key %q: request allowed (fail open): %w", p.Key, err)
	}
	if res.Allowed == 0 {
		d.Allowed = false
		d.RetryAfter = max(res.RetryAfter, time.Nanosecond)
		return d, nil
	}
	d.Remaining = remaining(lim, res.ResetAfter)
	return d, nil
}

// ask runs redis_rate's script for keyName's bucket, unless Redis failed within the cooldown.
func (l *Limiter) ask(ctx context.Context, keyName string, lim Limit, cost int) (*redis_rate.Result, error) {
	if l.opts.Cooldown > 0 {
		if until := l.downUntil.Load(); until != 0 {
			now := time.Now().UnixNano()
			// Past the cooldown, one caller (the swap's winner) asks Redis; the others wait for
			// its answer by failing open a while longer.
			if now < until || !l.downUntil.CompareAndSwap(until, now+int64(l.opts.Cooldown)) {
				return nil, ErrCooldown
			}
		}
	}
	rctx := ctx
	if l.opts.Timeout > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, l.opts.Timeout)
		defer cancel()
	}
	res, err := l.gcra.AllowN(rctx, l.bucket(keyName),
		redis_rate.Limit{Rate: lim.RequestsPerSec, Burst: lim.Burst, Period: time.Second}, cost)
	switch {
	case err == nil:
		if l.downUntil.Load() != 0 {
			l.downUntil.Store(0)
		}
		return res, nil
	case ctx.Err() != nil:
		// The caller gave up (a client went away): no news about Redis.
		return nil, err
	default:
		if l.opts.Cooldown > 0 {
			l.downUntil.Store(time.Now().Add(l.opts.Cooldown).UnixNano())
		}
		return nil, fmt.Errorf("asking Redis: %w", err)
	}
}

// bucket is the name of a key's bucket, before redis_rate's "rate:".
func (l *Limiter) bucket(keyName string) string { return l.opts.Prefix + "key:" + keyName }

// remaining derives the requests left after an allowed one from the time until the bucket is
// full again: burst - resetAfter*rate. redis_rate's own Remaining is that value truncated to an
// integer by Redis, so floating-point noise of a few nanoseconds turns 2 into 1; here the
// value is rounded down only after allowing a hundredth of a request for that noise.
func remaining(lim Limit, resetAfter time.Duration) int {
	r := float64(lim.Burst) - resetAfter.Seconds()*float64(lim.RequestsPerSec)
	return min(max(int(math.Floor(r+0.01)), 0), lim.Burst)
}

// RetryAfterSeconds is d in whole seconds for a Retry-After header: rounded up, at least 1.
func RetryAfterSeconds(d time.Duration) int {
	if d <= time.Second {
		return 1
	}
	return int((d + time.Second - 1) / time.Second)
}
