// Package quota holds the concurrency slots of each tenant:project in Redis, as leases: a
// sandbox that is CREATING, STARTING or RUNNING holds one slot, and a full project refuses new
// ones with QUOTA_EXCEEDED. A slot is a member of the project's sorted set whose score is the
// lease expiry (unix ms); a holder that is not renewed (a replica killed mid-create) loses its
// slot when the lease ends. Expiry is data compared with the caller's clock inside the scripts,
// never a key TTL, so the embedded Redis behaves like the real one.
//
// Redis is not the truth: when it loses a project's set (a FLUSHALL, a new Redis) the set is
// rebuilt from the runtime (Source) before any new slot is granted, so the limit is not
// overshot by slots the runtime already holds. Key schema and scripts: README.md beside this
// file.
package quota

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"

	"sandboxd/internal/apierror"
)

// Limits are the concurrency limits of tenant:project scopes.
type Limits struct {
	Default  int            // slots per tenant:project; <= 0 means unlimited
	PerScope map[string]int // "tenant:project" → limit, overriding Default
}

// For returns the limit of tenant:project: its PerScope entry, else Default. 0 means
// unlimited (a negative limit is returned as 0).
func (l Limits) For(tenant, project string) int {
	n, ok := l.PerScope[tenant+":"+project]
	if !ok {
		n = l.Default
	}
	return max(n, 0)
}

// Source lists, from the runtime's truth, the sandbox ids of a tenant:project that hold a
// slot (their state is CREATING, STARTING or RUNNING). Used to rebuild after Redis lost the set.
type Source func(ctx context.Context, tenant, project string) ([]string, error)

// Options configure a Quota. Zero values take the defaults.
type Options struct {
	Limits     Limits
	Lease      time.Duration    // lease of a slot; default 60s. Renewed by the reconciler.
	RetryAfter time.Duration    // hint for a full project; default 5s
	Now        func() time.Time // default time.Now
	// Settle is how long a rebuild waits, after it found the set lost, before it lists the
	// runtime: a slot granted just before the loss must reach the runtime's records by then or
	// the rebuild misses it. It should exceed the time between a successful Acquire and the
	// holder showing up in Source. Default 250ms; negative means no wait.
	Settle time.Duration
}

const (
	defaultLease      = 60 * time.Second
	defaultRetryAfter = 5 * time.Second
	defaultSettle     = 250 * time.Millisecond
	// maxRebuilds bounds how often one call rebuilds a set that Redis keeps losing.
	maxRebuilds = 8
	// rebuildTimeout bounds one rebuild, which runs detached from the caller that started it.
	rebuildTimeout = 30 * time.Second
)

// Quota grants and tracks concurrency slots. It is safe for concurrent use.
type Quota struct {
	rdb     redis.UniversalClient
	source  Source
	opts    Options
	flights singleflight.Group // one rebuild per project at a time in this process
}

// New returns a Quota on rdb that rebuilds a project's slots from source when Redis lost them.
func New(rdb redis.UniversalClient, source Source, opts Options) *Quota {
	if opts.Lease <= 0 {
		opts.Lease = defaultLease
	}
	if opts.RetryAfter <= 0 {
		opts.RetryAfter = defaultRetryAfter
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Settle == 0 {
		opts.Settle = defaultSettle
	}
	return &Quota{rdb: rdb, source: source, opts: opts}
}

// Limit is tenant:project's concurrency limit (0: unlimited), from the configuration alone.
func (q *Quota) Limit(tenant, project string) int { return q.opts.Limits.For(tenant, project) }

// Lease is how long a slot is held without a renewal.
func (q *Quota) Lease() time.Duration { return q.opts.Lease }

// Usage is the limit of a project and the slots in use. Limit 0 means unlimited.
type Usage struct {
	Limit, InUse int
	// Held (Acquire only): id held a live slot before the call, which renewed it.
	Held bool
}

// scope names the keys of one tenant:project; all share the hash tag {tenant:project}.
type scope struct {
	tenant, project string
	name            string // tenant:project
	slots           string // sorted set: member sandbox id, score lease expiry (unix ms)
	built           string // marker: exists while slots is complete
	released        string // set: ids released while the marker was missing (tombstones)
	rebuilding      string // set: tokens of rebuilds in progress since the marker went missing
}

func scopeOf(tenant, project string) scope {
	name := tenant + ":" + project
	prefix := "quota:{" + name + "}:"
	return scope{tenant: tenant, project: project, name: name, slots: prefix + "slots", built: prefix + "built",
		released: prefix + "released", rebuilding: prefix + "rebuilding"}
}

func ms(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// Script results.
const (
	resRebuild = -1 // the marker is missing: rebuild, then try again
	resFull    = 0
	resAdded   = 1
	resRenewed = 2 // id held a live slot already
)

// Acquire takes one slot for sandbox id (idempotent: a holder acquiring again just renews).
// A full project → an *apierror.Error with Code QUOTA_EXCEEDED, a message saying limit and use,
// RetryAfter set, and Details "limit" and "in_use" (ints).
func (q *Quota) Acquire(ctx context.Context, tenant, project, id string) (Usage, error) {
	s := scopeOf(tenant, project)
	limit := q.opts.Limits.For(tenant, project)
	var u Usage
	var full bool
	err := q.withSet(ctx, s, "acquire", func() (bool, error) {
		now := q.opts.Now()
		res, err := acquireScript.Run(ctx, q.rdb, []string{s.slots, s.built},
			id, ms(now), ms(now.Add(q.opts.Lease)), limit).Int64Slice()
		if err != nil {
			return false, err
		}
		if len(res) != 2 {
			return false, fmt.Errorf("unexpected script result %v", res)
		}
		u = Usage{Limit: limit, InUse: int(res[1]), Held: res[0] == resRenewed}
		full = res[0] == resFull
		return res[0] != resRebuild, nil
	})
	if err != nil {
		return Usage{}, err
	}
	if full {
		return u, apierror.New(apierror.QuotaExceeded,
			"project %s is at its concurrency limit: %d of %d slots in use; stop or destroy a sandbox, or retry later",
			s.name, u.InUse, u.Limit).
			WithRetryAfter(q.opts.RetryAfter).WithDetail("limit", u.Limit).WithDetail("in_use", u.InUse)
	}
	return u, nil
}

// Release gives id's slot back (no error when it held none).
func (q *Quota) Release(ctx context.Context, tenant, project, id string) error {
	s := scopeOf(tenant, project)
	if err := releaseScript.Run(ctx, q.rdb, []string{s.slots, s.built, s.released}, id).Err(); err != nil {
		return fmt.Errorf("quota release %s in %s: %w", id, s.name, err)
	}
	return nil
}

// Renew extends the leases of ids (holders confirmed by runtime truth); ids that hold no slot
// are NOT added (use Acquire for that). Returns the ids that were missing.
func (q *Quota) Renew(ctx context.Context, tenant, project string, ids []string) (missing []string, err error) {
	if len(ids) == 0 {
		return nil, nil
	}
	s := scopeOf(tenant, project)
	err = q.withSet(ctx, s, "renew", func() (bool, error) {
		now := q.opts.Now()
		args := make([]any, 0, 2+len(ids))
		args = append(args, ms(now), ms(now.Add(q.opts.Lease)))
		for _, id := range ids {
			args = append(args, id)
		}
		v, err := renewScript.Run(ctx, q.rdb, []string{s.slots, s.built}, args...).Result()
		if err != nil {
			return false, err
		}
		switch v := v.(type) {
		case int64:
			return false, nil // resRebuild
		case []any:
			missing = make([]string, 0, len(v))
			for _, m := range v {
				id, _ := m.(string)
				missing = append(missing, id)
			}
			return true, nil
		default:
			return false, fmt.Errorf("unexpected script result %v", v)
		}
	})
	if err != nil {
		return nil, err
	}
	return missing, nil
}

// Usage reports limit and slots in use (expired leases not counted).
func (q *Quota) Usage(ctx context.Context, tenant, project string) (Usage, error) {
	s := scopeOf(tenant, project)
	var n int64
	err := q.withSet(ctx, s, "usage", func() (bool, error) {
		var err error
		n, err = usageScript.Run(ctx, q.rdb, []string{s.slots, s.built}, ms(q.opts.Now())).Int64()
		return n != resRebuild, err
	})
	if err != nil {
		return Usage{}, err
	}
	return Usage{Limit: q.opts.Limits.For(tenant, project), InUse: int(n)}, nil
}

// Held reports whether id holds a live slot.
func (q *Quota) Held(ctx context.Context, tenant, project, id string) (bool, error) {
	s := scopeOf(tenant, project)
	var n int64
	err := q.withSet(ctx, s, "held", func() (bool, error) {
		var err error
		n, err = heldScript.Run(ctx, q.rdb, []string{s.slots, s.built}, id, ms(q.opts.Now())).Int64()
		return n != resRebuild, err
	})
	if err != nil {
		return false, err
	}
	return n == 1, nil
}

// withSet runs op until it finds the project's set complete (op returns true), rebuilding the
// set from the runtime whenever op found the marker missing.
func (q *Quota) withSet(ctx context.Context, s scope, what string, op func() (bool, error)) error {
	for attempt := 1; ; attempt++ {
		done, err := op()
		if err != nil {
			return fmt.Errorf("quota %s in %s: %w", what, s.name, err)
		}
		if done {
			return nil
		}
		if attempt > maxRebuilds {
			return fmt.Errorf("quota %s in %s: Redis lost the slots again during each of %d rebuilds", what, s.name, maxRebuilds)
		}
		if err := q.rebuild(ctx, s); err != nil {
			return err
		}
	}
}

// rebuild restores the project's set from the runtime. Callers in this process share one
// rebuild per project; rebuilds in several replicas at once are harmless (the first one to
// finish marks the set complete; the others then change nothing). It runs detached from ctx so
// that one cancelled request does not fail the others waiting on it.
func (q *Quota) rebuild(ctx context.Context, s scope) error {
	ch := q.flights.DoChan(s.name, func() (any, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rebuildTimeout)
		defer cancel()
		return nil, q.rebuildOnce(rctx, s)
	})
	select {
	case <-ctx.Done():
		return ctx.Err()
	case r := <-ch:
		return r.Err
	}
}

// rebuildOnce registers a rebuild token, waits Settle, lists the runtime and runs the rebuild
// script. When Redis was flushed again meanwhile (the token is gone, and with it any
// tombstones) the script changes nothing and the caller's next try rebuilds afresh.
func (q *Quota) rebuildOnce(ctx context.Context, s scope) error {
	token := newToken()
	if err := q.rdb.SAdd(ctx, s.rebuilding, token).Err(); err != nil {
		return fmt.Errorf("quota rebuild %s: %w", s.name, err)
	}
	if q.opts.Settle > 0 {
		t := time.NewTimer(q.opts.Settle)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	ids, err := q.source(ctx, s.tenant, s.project)
	if err != nil {
		return fmt.Errorf("quota rebuild %s: listing the runtime: %w", s.name, err)
	}
	now := q.opts.Now()
	args := make([]any, 0, 3+len(ids))
	args = append(args, token, ms(now), ms(now.Add(q.opts.Lease)))
	for _, id := range ids {
		args = append(args, id)
	}
	if err := rebuildScript.Run(ctx, q.rdb, []string{s.slots, s.built, s.released, s.rebuilding}, args...).Err(); err != nil {
		return fmt.Errorf("quota rebuild %s: %w", s.name, err)
	}
	return nil
}

func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// acquireScript takes or renews the slot of one sandbox.
// KEYS[1] slots, KEYS[2] built marker.
// ARGV[1] sandbox id, ARGV[2] now (unix ms), ARGV[3] lease expiry (unix ms), ARGV[4] limit (<= 0 unlimited).
// Returns {status, in_use}: status -1 marker missing (nothing changed; rebuild and retry),
// 0 full, 1 added, 2 renewed (id already held a live slot); in_use counts live slots after the call.
// Leases that ended at or before now are dropped first.
var acquireScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[2]) == 0 then return {-1, 0} end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
local n = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  return {2, n}
end
local limit = tonumber(ARGV[4])
if limit > 0 and n >= limit then return {0, n} end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return {1, n + 1}`)

// releaseScript gives one sandbox's slot back.
// KEYS[1] slots, KEYS[2] built marker, KEYS[3] released (tombstones). ARGV[1] sandbox id.
// Returns 1 when id held a slot, else 0. While the marker is missing the id is also added to
// KEYS[3], so that a rebuild that listed the runtime before this release does not add it back.
var releaseScript = redis.NewScript(`
local n = redis.call('ZREM', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 0 then redis.call('SADD', KEYS[3], ARGV[1]) end
return n`)

// renewScript extends the leases of the ids that hold a live slot; it never adds one.
// KEYS[1] slots, KEYS[2] built marker. ARGV[1] now (unix ms), ARGV[2] lease expiry (unix ms),
// ARGV[3..] sandbox ids. Returns -1 when the marker is missing (nothing changed), else the
// array of ids that held no live slot. Leases that ended at or before now are dropped first.
var renewScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local missing = {}
for i = 3, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[2], ARGV[i])
  else
    missing[#missing + 1] = ARGV[i]
  end
end
return missing`)

// usageScript counts live slots (read-only).
// KEYS[1] slots, KEYS[2] built marker. ARGV[1] now (unix ms).
// Returns -1 when the marker is missing, else the number of leases ending after now.
var usageScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
return redis.call('ZCOUNT', KEYS[1], '(' .. ARGV[1], '+inf')`)

// heldScript reports whether one sandbox holds a live slot (read-only).
// KEYS[1] slots, KEYS[2] built marker. ARGV[1] sandbox id, ARGV[2] now (unix ms).
// Returns -1 when the marker is missing, 1 when id's lease ends after now, else 0.
var heldScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if s and tonumber(s) > tonumber(ARGV[2]) then return 1 end
return 0`)

// rebuildScript restores the set from the runtime's holders and marks it complete, atomically.
// KEYS[1] slots, KEYS[2] built marker, KEYS[3] released (tombstones), KEYS[4] rebuilding (tokens).
// ARGV[1] this rebuild's token, ARGV[2] now (unix ms), ARGV[3] lease expiry (unix ms),
// ARGV[4..] the sandbox ids the runtime lists as holders.
// Returns 0 when the marker already exists (another rebuild finished; nothing added),
// -1 when the token is gone (Redis was flushed after this rebuild began, taking tombstones
// with it; nothing changed), else 1: each id not in KEYS[3] is added with a fresh lease unless
// already present (NX), the marker is set, and KEYS[3] and KEYS[4] are deleted.
var rebuildScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('SREM', KEYS[4], ARGV[1])
  return 0
end
if redis.call('SISMEMBER', KEYS[4], ARGV[1]) == 0 then return -1 end
for i = 4, #ARGV do
  if redis.call('SISMEMBER', KEYS[3], ARGV[i]) == 0 then
    redis.call('ZADD', KEYS[1], 'NX', ARGV[3], ARGV[i])
  end
end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[3], KEYS[4])
return 1`)
