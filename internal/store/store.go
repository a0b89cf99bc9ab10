// Package store is the Redis lookup of sandboxes: sandbox id → owner, state and profile, plus a
// per-project index for listing. It is a cache of the runtime's records, never the truth: when
// Redis loses it (a restart, a FLUSHALL) it is rebuilt by listing the runtime. It also holds the
// short per-sandbox operation locks that keep two replicas from acting on one sandbox at once.
//
// Key schema (see README.md beside this file): every key of one sandbox shares the hash tag
// {id}; every key of one project shares {tenant:project}.
package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Errors.
var (
	ErrNotFound = errors.New("store: not found")
	// ErrLocked means another operation holds the sandbox's lock.
	ErrLocked = errors.New("store: sandbox is locked by another operation")
)

// Entry is the lookup of one sandbox.
type Entry struct {
	ID        string
	Tenant    string
	Project   string
	State     string
	Profile   string
	CreatedAt time.Time
	// Labels are the sandbox's labels, a hint for filtering lists (the record has the truth).
	Labels map[string]string
}

// Source lists the runtime truth the lookup is rebuilt from.
type Source func(ctx context.Context) ([]Entry, error)

// Store is the Redis lookup.
type Store struct {
	rdb    redis.UniversalClient
	source Source
	now    func() time.Time
	// pages are the ids the latest reads of list pages found, read again with the next read of
	// the same page (pageMemo).
	pages *pageMemo
}

// New returns a Store on rdb that rebuilds itself from source when Redis has lost the lookup.
func New(rdb redis.UniversalClient, source Source) *Store {
	return &Store{rdb: rdb, source: source, now: time.Now, pages: newPageMemo(pageMemoKeys, pageMemoIDs)}
}

// WithClock sets the clock that stamps a rebuild (the time idle clocks restart from after a
// loss of Redis, see Activity), for tests that move time; it returns s.
func (s *Store) WithClock(now func() time.Time) *Store {
	s.now = now
	return s
}

const (
	// builtKey exists while the lookup is complete; FLUSHALL removes it and so triggers a rebuild.
	// Its value is the time of the rebuild (RFC 3339), which Activity never reports earlier than.
	builtKey   = "sbx:lookup:built"
	rebuildKey = "sbx:lookup:rebuild-lock"
	// fenceKey is the counter the fences of all operation locks are drawn from.
	fenceKey = "sbx:lock:fence"
)

func entryKey(id string) string              { return "sbx:{" + id + "}:entry" }
func lockKey(id string) string               { return "sbx:{" + id + "}:lock" }
func activityKey(id string) string           { return "sbx:{" + id + "}:activity" }
func indexKey(tenant, project string) string { return "sbx:{" + tenant + ":" + project + "}:index" }

func (e Entry) fields() map[string]any {
	return map[string]any{
		"tenant": e.Tenant, "project": e.Project, "state": e.State, "profile": e.Profile,
		"created_at": strconv.FormatInt(e.CreatedAt.UnixMilli(), 10), "labels": encodeLabels(e.Labels),
	}
}

// encodeLabels is the entry's labels field: a JSON object, "" for none.
func encodeLabels(labels map[string]string) string {
	if len(labels) == 0 {
		return ""
	}
	b, _ := json.Marshal(labels) // a map of strings always encodes
	return string(b)
}

func parseEntry(id string, m map[string]string) (Entry, bool) {
	if len(m) == 0 || m["tenant"] == "" {
		return Entry{}, false
	}
	ms, _ := strconv.ParseInt(m["created_at"], 10, 64)
	e := Entry{ID: id, Tenant: m["tenant"], Project: m["project"], State: m["state"], Profile: m["profile"],
		CreatedAt: time.UnixMilli(ms).UTC()}
	if v := m["labels"]; v != "" {
		// A hint: one that does not decode is none, and the record decides.
		_ = json.Unmarshal([]byte(v), &e.Labels)
	}
	return e, true
}

// Put stores or replaces an entry and indexes it under its project.
func (s *Store) Put(ctx context.Context, e Entry) error {
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, entryKey(e.ID), e.fields())
		return nil
	})
	if err != nil {
		return fmt.Errorf("store put %s: %w", e.ID, err)
	}
	// The index lives in another hash slot (the project's), so it is a separate command.
	if err := s.rdb.ZAdd(ctx, indexKey(e.Tenant, e.Project), redis.Z{Score: 0, Member: e.ID}).Err(); err != nil {
		return fmt.Errorf("store index %s: %w", e.ID, err)
	}
	return nil
}

// SetState updates the cached state of an existing entry.
func (s *Store) SetState(ctx context.Context, id, state string) error {
	// Only touch an entry that exists, so a late write cannot resurrect a deleted sandbox.
	n, err := setStateScript.Run(ctx, s.rdb, []string{entryKey(id)}, state).Int()
	if err != nil {
		return fmt.Errorf("store set state %s: %w", id, err)
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// SetLabels updates the labels hint of an existing entry.
func (s *Store) SetLabels(ctx context.Context, id string, labels map[string]string) error {
	n, err := setFieldScript.Run(ctx, s.rdb, []string{entryKey(id)}, "labels", encodeLabels(labels)).Int()
	if err != nil {
		return fmt.Errorf("store set labels %s: %w", id, err)
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// setFieldScript sets one field of an existing hash.
// KEYS[1] entry hash; ARGV[1] the field; ARGV[2] its value. Returns 1 when set, 0 when the
// entry is missing.
var setFieldScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1`)

// setStateScript sets field state of an existing hash.
// KEYS[1] entry hash; ARGV[1] the state. Returns 1 when set, 0 when the entry is missing.
var setStateScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1])
return 1`)

// Delete removes an entry and its index member.
func (s *Store) Delete(ctx context.Context, e Entry) error {
	if err := s.rdb.Del(ctx, entryKey(e.ID)).Err(); err != nil {
		return fmt.Errorf("store delete %s: %w", e.ID, err)
	}
	if err := s.rdb.ZRem(ctx, indexKey(e.Tenant, e.Project), e.ID).Err(); err != nil {
		return fmt.Errorf("store unindex %s: %w", e.ID, err)
	}
	return nil
}

// Get returns the entry of id, rebuilding the lookup first when Redis has lost it.
func (s *Store) Get(ctx context.Context, id string) (Entry, error) {
	for attempt := 0; ; attempt++ {
		var hget *redis.MapStringStringCmd
		var built *redis.IntCmd
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			hget = p.HGetAll(ctx, entryKey(id))
			built = p.Exists(ctx, builtKey)
			return nil
		})
		if err != nil {
			return Entry{}, fmt.Errorf("store get %s: %w", id, err)
		}
		if e, ok := parseEntry(id, hget.Val()); ok {
			return e, nil
		}
		if built.Val() == 1 || attempt > 0 {
			return Entry{}, ErrNotFound
		}
		if err := s.EnsureBuilt(ctx); err != nil {
			return Entry{}, err
		}
	}
}

// List returns up to limit entries of a project, newest first (ids sort by creation time),
// starting after the id after ("" for the first page).
func (s *Store) List(ctx context.Context, tenant, project, after string, limit int) ([]Entry, error) {
	out, _, err := s.list(ctx, tenant, project, after, limit, false)
	return out, err
}

// ListActive is List with the last activity of every listed sandbox, as Activity reports it,
// read in the same round trips (a list page of running sandboxes needs both).
func (s *Store) ListActive(ctx context.Context, tenant, project, after string, limit int) ([]Entry, map[string]time.Time, error) {
	return s.list(ctx, tenant, project, after, limit, true)
}

func (s *Store) list(ctx context.Context, tenant, project, after string, limit int, activity bool) ([]Entry, map[string]time.Time, error) {
	max := "+"
	if after != "" {
		max = "(" + after
	}
	by := &redis.ZRangeBy{Max: max, Min: "-", Count: int64(limit)}
	// The built marker and the index page in one round trip (EnsureBuilt's check without a
	// round trip of its own); after a rebuild both are read again. The entries (and activity)
	// of the ids the last read of this page found are read with them: a page read again (a
	// dashboard's poll, the next page of a walk done before) takes one round trip instead of
	// two. Every value is read in this request, so nothing is older than the index page; the
	// memo only says which keys to read early. Ids the page has that the guess lacked are read
	// in a second round trip, as every id was before.
	memoKey := pageKey(tenant, project, after, limit)
	guess := s.pages.get(memoKey)
	var built *redis.StringCmd
	var page *redis.StringSliceCmd
	var reads map[string]entryReads
	for attempt := 0; ; attempt++ {
		reads = make(map[string]entryReads, len(guess))
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			built = p.Get(ctx, builtKey)
			page = p.ZRevRangeByLex(ctx, indexKey(tenant, project), by)
			for _, id := range guess {
				reads[id] = queueEntryReads(ctx, p, id, activity)
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, nil, fmt.Errorf("store list %s:%s: %w", tenant, project, err)
		}
		if err := page.Err(); err != nil {
			return nil, nil, fmt.Errorf("store list %s:%s: %w", tenant, project, err)
		}
		if !errors.Is(built.Err(), redis.Nil) || attempt > 0 {
			break
		}
		if err := s.Rebuild(ctx); err != nil {
			return nil, nil, err
		}
	}
	ids := page.Val()
	s.pages.put(memoKey, ids)
	var missing []string
	for _, id := range ids {
		if _, ok := reads[id]; !ok {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, id := range missing {
				reads[id] = queueEntryReads(ctx, p, id, activity)
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, nil, fmt.Errorf("store list %s:%s: %w", tenant, project, err)
		}
	}
	out := make([]Entry, 0, len(ids))
	var last map[string]time.Time
	var rebuilt time.Time
	if activity {
		last = make(map[string]time.Time, len(ids))
		var err error
		if rebuilt, err = s.rebuiltAt(ctx, built); err != nil {
			return nil, nil, err
		}
	}
	for _, id := range ids {
		r := reads[id]
		if err := r.entry.Err(); err != nil {
			return nil, nil, fmt.Errorf("store list %s:%s: %w", tenant, project, err)
		}
		e, ok := parseEntry(id, r.entry.Val())
		if !ok || e.Tenant != tenant || e.Project != project {
			continue
		}
		out = append(out, e)
		if activity {
			last[id] = rebuilt
			if ms, err := r.activity.Int64(); err == nil && time.UnixMilli(ms).After(rebuilt) {
				last[id] = time.UnixMilli(ms).UTC()
			}
		}
	}
	return out, last, nil
}

// entryReads are the reads of one listed sandbox's entry and, for ListActive, its activity.
type entryReads struct {
	entry    *redis.MapStringStringCmd
	activity *redis.StringCmd
}

func queueEntryReads(ctx context.Context, p redis.Pipeliner, id string, activity bool) entryReads {
	r := entryReads{entry: p.HGetAll(ctx, entryKey(id))}
	if activity {
		r.activity = p.Get(ctx, activityKey(id))
	}
	return r
}

// EnsureBuilt rebuilds the lookup from the runtime when Redis does not hold a complete one.
func (s *Store) EnsureBuilt(ctx context.Context) error {
	n, err := s.rdb.Exists(ctx, builtKey).Result()
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if n == 1 {
		return nil
	}
	return s.Rebuild(ctx)
}

// Rebuild lists the runtime and writes every entry, then marks the lookup complete. Concurrent
// rebuilds from several replicas are harmless (they write the same truth); a short lock keeps
// them from all listing the runtime at once.
func (s *Store) Rebuild(ctx context.Context) error {
	token := newToken()
	ok, err := lockScript.Run(ctx, s.rdb, []string{rebuildKey}, token, time.Now().UnixMilli(), int64(30000), 0).Int()
	if err != nil {
		return fmt.Errorf("store rebuild: %w", err)
	}
	if ok == 0 {
		// Another replica is rebuilding: wait for it (bounded), then go on either way.
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if n, err := s.rdb.Exists(ctx, builtKey).Result(); err == nil && n == 1 {
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	defer unlockScript.Run(context.WithoutCancel(ctx), s.rdb, []string{rebuildKey}, token)
	entries, err := s.source(ctx)
	if err != nil {
		return fmt.Errorf("store rebuild: listing the runtime: %w", err)
	}
	for _, e := range entries {
		if err := s.Put(ctx, e); err != nil {
			return err
		}
	}
	if err := s.rdb.Set(ctx, builtKey, s.now().UTC().Format(time.RFC3339Nano), 0).Err(); err != nil {
		return fmt.Errorf("store rebuild: %w", err)
	}
	return nil
}

// Lock is a held per-sandbox operation lock.
type Lock struct {
	s     *Store
	key   string
	token string
	fence uint64
	ttl   time.Duration
	stop  chan struct{}
	done  chan struct{}
}

// Lock takes the operation lock of sandbox id for ttl, renewing it every ttl/3 until Unlock.
// ErrLocked when another holder has it. Expiry is data compared with the caller's clock inside
// the scripts, not a Redis key TTL, so the embedded Redis behaves like the real one.
//
// A lock that is taken gets a fence (Lock.Fence), in three steps, each one script on one key:
// take the lock (lockScript), draw the next fence from the counter all locks share
// (fenceScript), then renew the lock (lockScript again), which succeeds only while the lock
// still holds this take's token. (One script cannot take the lock and draw the fence: the
// lock's key carries the sandbox's hash tag and the counter none, and no script touches keys
// of two hash slots, so that the schema works on Redis Cluster.) A confirmed take therefore had
// no other take of this sandbox's lock between its take and its renewal: every earlier holder
// of the lock drew its fence before this take, every later one draws after this renewal, so
// the fences of one sandbox's holders rise with every take; a take overtaken by another before
// its renewal is told ErrLocked. Renewals draw nothing.
func (s *Store) Lock(ctx context.Context, id string, ttl time.Duration) (*Lock, error) {
	for attempt := 1; ; attempt++ {
		l, err := s.tryLock(ctx, id, ttl)
		if errors.Is(err, errLockVanished) && attempt < lockAttempts {
			continue // Redis lost it between take and renewal (a flush): nobody holds it, take it again
		}
		if errors.Is(err, errLockVanished) {
			return nil, ErrLocked
		}
		return l, err
	}
}

// lockAttempts bounds the takes of one Lock whose lock vanished before its renewal.
const lockAttempts = 3

// errLockVanished: the lock's key was gone at the renewal that confirms a take (Redis lost its
// data meanwhile), so the take is not confirmed, but nobody else holds the lock either.
var errLockVanished = errors.New("store: the lock vanished before its renewal")

// tryLock is one take of Lock: take, draw the fence, renew.
func (s *Store) tryLock(ctx context.Context, id string, ttl time.Duration) (*Lock, error) {
	l := &Lock{s: s, key: lockKey(id), token: newToken(), ttl: ttl, stop: make(chan struct{}), done: make(chan struct{})}
	ok, err := lockScript.Run(ctx, s.rdb, []string{l.key}, l.token, time.Now().UnixMilli(), ttl.Milliseconds(), 0).Int()
	if err != nil {
		return nil, fmt.Errorf("store lock %s: %w", id, err)
	}
	if ok == 0 {
		return nil, ErrLocked
	}
	l.fence, err = s.drawFence(ctx)
	if err == nil {
		ok, err = lockScript.Run(ctx, s.rdb, []string{l.key}, l.token, time.Now().UnixMilli(), ttl.Milliseconds(), 1).Int()
		if err == nil && ok == 0 {
			return nil, ErrLocked // another holder took it meanwhile: it is not ours to release
		}
		if err == nil && ok == -1 {
			return nil, errLockVanished
		}
	}
	if err != nil {
		unlockScript.Run(context.WithoutCancel(ctx), s.rdb, []string{l.key}, l.token)
		return nil, fmt.Errorf("store lock %s: %w", id, err)
	}
	go l.renew()
	return l, nil
}

// Fence is the lock's fencing token: larger than the fence of every earlier holder of this
// sandbox's lock, and than every fence drawn before it for any sandbox. Pass it with every
// write the lock guards (runtime.WithFence), so that the runtime refuses the writes of a holder
// whose lease ran out after a newer holder wrote.
func (l *Lock) Fence() uint64 { return l.fence }

// drawFence draws the next fence: one more than the last one drawn, and at least the caller's
// clock in microseconds since the Unix epoch. The clock is what keeps fences rising across a
// loss of Redis's data (a restart of the embedded Redis, a FLUSHALL), which resets the counter:
// the first fence drawn afterwards is the drawing replica's clock, larger than every fence
// drawn before the loss as long as (1) the replicas' clocks disagree by less than the time
// between the last fence drawn before the loss and the first drawn after it (NTP keeps them
// within milliseconds; Redis comes back in seconds), and (2) fewer than one fence per
// microsecond was drawn on average before it, so the counter never ran ahead of the clock.
// Should either fail, the runtime refuses the new holder's writes (it has seen a higher fence)
// until a later fence passes the old ones: a stalled operation, never two holders' writes
// interleaved. Microseconds since 1970 stay below 2^53, so Lua's numbers hold them exactly
// for another two centuries.
func (s *Store) drawFence(ctx context.Context) (uint64, error) {
	n, err := fenceScript.Run(ctx, s.rdb, []string{fenceKey}, strconv.FormatInt(time.Now().UnixMicro(), 10)).Int64()
	if err != nil {
		return 0, fmt.Errorf("drawing a fence: %w", err)
	}
	if n <= 0 {
		return 0, fmt.Errorf("drawing a fence: got %d", n)
	}
	return uint64(n), nil
}

// fenceScript draws a fence. KEYS[1] the fence counter; ARGV[1] the caller's clock (unix µs, a
// decimal string). Returns max(INCR of the counter, the clock) and leaves the counter there.
var fenceScript = redis.NewScript(`
local n = redis.call('INCR', KEYS[1])
local now = tonumber(ARGV[1])
if n < now then
  redis.call('SET', KEYS[1], ARGV[1])
  return now
end
return n`)

func (l *Lock) renew() {
	defer close(l.done)
	t := time.NewTicker(l.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), l.ttl/3)
			_, _ = l.Renew(ctx)
			cancel()
		}
	}
}

// Renew renews the lock now and reports whether it is still ours: false when another holder
// took it or Redis lost it (the background renewal then renews nothing any more).
func (l *Lock) Renew(ctx context.Context) (bool, error) {
	ok, err := lockScript.Run(ctx, l.s.rdb, []string{l.key}, l.token, time.Now().UnixMilli(), l.ttl.Milliseconds(), 1).Int()
	if err != nil {
		return false, fmt.Errorf("store renew %s: %w", l.key, err)
	}
	return ok == 1, nil
}

// Unlock releases the lock if it is still ours.
func (l *Lock) Unlock(ctx context.Context) {
	close(l.stop)
	<-l.done
	unlockScript.Run(context.WithoutCancel(ctx), l.s.rdb, []string{l.key}, l.token)
}

// lockScript takes or renews a lock whose value is "token|expiry_ms".
// KEYS[1] lock key; ARGV[1] token; ARGV[2] now (ms); ARGV[3] ttl (ms); ARGV[4] 1 to renew only.
// Returns 1 when the lock is ours until now+ttl, 0 when another holder's lease is still valid
// (or, renewing, when another holds it), -1 when renewing a lock that no longer exists (Redis
// lost it: nobody holds it).
var lockScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
local now = tonumber(ARGV[2])
if v then
  local sep = string.find(v, '|', 1, true)
  local holder = string.sub(v, 1, sep - 1)
  local expiry = tonumber(string.sub(v, sep + 1))
  if holder ~= ARGV[1] and expiry > now then return 0 end
  if ARGV[4] == '1' and holder ~= ARGV[1] then return 0 end
elseif ARGV[4] == '1' then
  return -1
end
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. (now + tonumber(ARGV[3])))
return 1`)

// unlockScript deletes a lock only if we hold it.
// KEYS[1] lock key; ARGV[1] token. Returns 1 when deleted, 0 otherwise.
var unlockScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. '|' then return redis.call('DEL', KEYS[1]) end
return 0`)

func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Touch records activity on sandbox id at the time at (unix ms). Activity lives in Redis: after
// a loss of Redis's data Activity reports the time of the lookup's rebuild instead.
func (s *Store) Touch(ctx context.Context, id string, at time.Time) error {
	if err := s.rdb.Set(ctx, activityKey(id), at.UnixMilli(), 0).Err(); err != nil {
		return fmt.Errorf("store touch %s: %w", id, err)
	}
	return nil
}

// Activity returns, for each id, when its idle clock started as far as Redis knows: its last
// recorded activity, or the time the lookup was last rebuilt when that is later. A rebuild
// happens only when Redis lost its data (a FLUSHALL, a new or emptied Redis), which loses the
// recorded activity too; reporting the rebuild then means an idle clock restarts from the
// rebuild, never from an earlier moment (such as the sandbox's last state change, which the
// caller also takes the later of). When Redis holds no lookup, Activity rebuilds it first, so a
// caller that reads activity before anything else after a flush (the reconciler) still gets
// the rebuild's time; if another replica's rebuild does not finish in time, it reports now.
func (s *Store) Activity(ctx context.Context, ids ...string) (map[string]time.Time, error) {
	cmds := make([]*redis.StringCmd, len(ids))
	var built *redis.StringCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		built = p.Get(ctx, builtKey)
		for i, id := range ids {
			cmds[i] = p.Get(ctx, activityKey(id))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("store activity: %w", err)
	}
	rebuilt, err := s.rebuiltAt(ctx, built)
	if err != nil {
		return nil, err
	}
	out := make(map[string]time.Time, len(ids))
	for i, id := range ids {
		out[id] = rebuilt
		if ms, err := cmds[i].Int64(); err == nil && time.UnixMilli(ms).After(rebuilt) {
			out[id] = time.UnixMilli(ms).UTC()
		}
	}
	return out, nil
}

// rebuiltAt is the time of the lookup's last rebuild (built: the pipelined GET of builtKey),
// rebuilding it first when it is missing.
func (s *Store) rebuiltAt(ctx context.Context, built *redis.StringCmd) (time.Time, error) {
	v, err := built.Result()
	if errors.Is(err, redis.Nil) {
		if err := s.Rebuild(ctx); err != nil {
			return time.Time{}, fmt.Errorf("store activity: %w", err)
		}
		v, err = s.rdb.Get(ctx, builtKey).Result()
		if errors.Is(err, redis.Nil) {
			return s.now().UTC(), nil // another replica's rebuild is still under way: it is now at the earliest
		}
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("store activity: %w", err)
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return s.now().UTC(), nil // not ours to read: the safe side is now
	}
	return t.UTC(), nil
}

// ForgetActivity drops the activity of a destroyed sandbox.
func (s *Store) ForgetActivity(ctx context.Context, id string) error {
	return s.rdb.Del(ctx, activityKey(id)).Err()
}

// changesChannel is the pub/sub channel on which every replica announces the sandboxes whose
// runtime record it wrote, so that the others drop their cached copy (internal/sandbox's read
// cache). A notice may be lost (pub/sub keeps nothing): readers bound the age of what they
// cache as well.
const changesChannel = "sbx:records:changed"

// Changed announces that sandbox id's runtime record or compute changed.
func (s *Store) Changed(ctx context.Context, id string) error {
	if err := s.rdb.Publish(ctx, changesChannel, id).Err(); err != nil {
		return fmt.Errorf("store announce %s: %w", id, err)
	}
	return nil
}

// WatchChanges calls changed with the id of every change any replica announces, and reset
// each time the watch (re)subscribes, since notices sent while it was not subscribed are
// lost. It returns when ctx ends.
func (s *Store) WatchChanges(ctx context.Context, changed func(id string), reset func()) {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		ps := s.rdb.Subscribe(ctx, changesChannel)
		// A blocked Receive does not watch ctx: closing the subscription ends it.
		stop := context.AfterFunc(ctx, func() { ps.Close() })
		for {
			msg, err := ps.Receive(ctx)
			if err != nil {
				break
			}
			switch m := msg.(type) {
			case *redis.Subscription:
				reset()
				backoff = 50 * time.Millisecond
			case *redis.Message:
				changed(m.Payload)
			}
		}
		stop()
		ps.Close()
		reset()
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}
