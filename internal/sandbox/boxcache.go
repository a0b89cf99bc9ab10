package sandbox

import (
	"container/list"
	"context"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"sandboxd/internal/store"
	"sandboxd/runtime"
)

// Read cache: the boxes this replica read from the runtime, so that a GET or a list does not
// read the runtime's record (a file and runsc's state locally; the API server on Kubernetes)
// on every call.
//
// What it promises:
//   - A read after a write on the same replica sees the write: every runtime write this
//     replica makes goes through cachedDriver, which drops the box before and after the write,
//     and a read that began before a drop never fills the cache (the generation check).
//   - Another replica's write is seen once its change notice arrives (store.Changed, published
//     after every write; a replica whose notice subscription broke or was just made drops the
//     whole cache), and in any case within the entry's age bound, DefaultReadCacheTTL: an entry
//     is never served older than that. Changes no replica writes (a box whose compute died) are
//     seen within the same bound, and at once by the paths that act on a box after a failure
//     (attach, guest errors, the exec follower's Box), which read the runtime directly.
//   - Tenancy is checked on every read, on the cached record's owner, exactly as on a fresh
//     one: the cache is keyed by sandbox id only and holds no answer per caller.
//   - It is bounded: at most maxEntries boxes, the least recently used dropped first, and
//     entries older than the TTL are never served.
const (
	// DefaultReadCacheTTL is how old a cached box may be when it is served.
	DefaultReadCacheTTL = time.Second
	// DefaultReadCacheEntries bounds the boxes cached per replica (a box's record is ~1-2 KiB).
	DefaultReadCacheEntries = 10000
	// touchEvery coalesces activity writes: one sandbox's activity is written to Redis at most
	// once per touchEvery by one replica (an idle clock counts minutes; a second is nothing).
	touchEvery = time.Second
)

// boxCache is a bounded LRU of runtime boxes with a maximum age and a generation that every
// invalidation raises (so that a read that raced a write does not put the old box back).
type boxCache struct {
	mu      sync.Mutex
	ttl     time.Duration
	max     int
	now     func() time.Time
	gen     uint64
	lru     *list.List // of *cacheEntry, most recent first
	entries map[string]*list.Element
	// touched is when this replica last wrote each sandbox's activity (bounded by max too).
	touched map[string]time.Time
	hits    uint64
	misses  uint64
}

type cacheEntry struct {
	id  string
	box runtime.Box
	at  time.Time
}

func newBoxCache(ttl time.Duration, max int, now func() time.Time) *boxCache {
	if ttl <= 0 {
		ttl = DefaultReadCacheTTL
	}
	if max <= 0 {
		max = DefaultReadCacheEntries
	}
	return &boxCache{ttl: ttl, max: max, now: now, lru: list.New(), entries: map[string]*list.Element{},
		touched: map[string]time.Time{}}
}

// get returns the cached box of id when it is younger than the TTL.
func (c *boxCache) get(id string) (runtime.Box, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[id]; ok {
		e := el.Value.(*cacheEntry)
		if c.now().Sub(e.at) < c.ttl {
			c.lru.MoveToFront(el)
			c.hits++
			return cloneBox(e.box), true
		}
		c.lru.Remove(el)
		delete(c.entries, id)
	}
	c.misses++
	return runtime.Box{}, false
}

// generation is the current generation and the time, for a read-through about to start.
func (c *boxCache) generation() (uint64, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen, c.now()
}

// put caches box, read at time at, unless an invalidation happened since generation gen.
func (c *boxCache) put(box runtime.Box, gen uint64, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	id := box.Record.ID
	box = cloneBox(box)
	if el, ok := c.entries[id]; ok {
		el.Value = &cacheEntry{id: id, box: box, at: at}
		c.lru.MoveToFront(el)
		return
	}
	c.entries[id] = c.lru.PushFront(&cacheEntry{id: id, box: box, at: at})
	for c.lru.Len() > c.max {
		old := c.lru.Back()
		c.lru.Remove(old)
		delete(c.entries, old.Value.(*cacheEntry).id)
	}
}

// forget drops id and ends every read-through under way (they do not fill the cache).
func (c *boxCache) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	if el, ok := c.entries[id]; ok {
		c.lru.Remove(el)
		delete(c.entries, id)
	}
}

// reset drops everything (the change notices may have been missed).
func (c *boxCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.lru.Init()
	clear(c.entries)
}

// len is the number of cached boxes.
func (c *boxCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// shouldTouch reports whether this replica should write id's activity at now (it did not
// within touchEvery, or exact asks for the write anyway), and notes it when so.
func (c *boxCache) shouldTouch(id string, now time.Time, exact bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if last, ok := c.touched[id]; !exact && ok && now.Sub(last) < touchEvery && !now.Before(last) {
		return false
	}
	if len(c.touched) >= c.max {
		clear(c.touched) // bounded: the worst is one extra write per sandbox
	}
	c.touched[id] = now
	return true
}

// untouch forgets id's last activity write (the write failed, or the sandbox is gone).
func (c *boxCache) untouch(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.touched, id)
}

// cachedDriver is the runtime driver the Service works with: Get is served from the cache,
// and every write drops the box before and after it and announces the change to the other
// replicas (announce). Everything else is the driver's own.
type cachedDriver struct {
	runtime.Driver
	c        *boxCache
	announce func(id string)
}

// withCache wraps d; like tracing.Driver it keeps d's WorkspaceExporter and WorkspaceSeeder,
// and its Pooler too (a claim turns a pool box into a sandbox: the box is dropped and announced
// around it like around any write).
func withCache(d runtime.Driver, c *boxCache, announce func(id string)) runtime.Driver {
	return (&cachedDriver{Driver: d, c: c, announce: announce}).wrap()
}

// Unwrap returns the wrapped driver (runtime.Capability).
func (cd *cachedDriver) Unwrap() runtime.Driver { return cd.Driver }

// wrap returns cd with the optional interfaces of the driver it wraps.
func (cd *cachedDriver) wrap() runtime.Driver {
	d := cd.Driver
	ex, isEx := d.(runtime.WorkspaceExporter)
	sd, isSd := d.(runtime.WorkspaceSeeder)
	pl, isPl := d.(runtime.Pooler)
	seeder := cachedSeeder{cd: cd, sd: sd}
	pooler := cachedPooler{cd: cd, p: pl}
	switch {
	case isEx && isSd && isPl:
		return struct {
			*cachedDriver
			runtime.WorkspaceExporter
			cachedSeeder
			cachedPooler
		}{cd, ex, seeder, pooler}
	case isEx && isSd:
		return struct {
			*cachedDriver
			runtime.WorkspaceExporter
			cachedSeeder
		}{cd, ex, seeder}
	case isEx && isPl:
		return struct {
			*cachedDriver
			runtime.WorkspaceExporter
			cachedPooler
		}{cd, ex, pooler}
	case isSd && isPl:
		return struct {
			*cachedDriver
			cachedSeeder
			cachedPooler
		}{cd, seeder, pooler}
	case isEx:
		return struct {
			*cachedDriver
			runtime.WorkspaceExporter
		}{cd, ex}
	case isSd:
		return struct {
			*cachedDriver
			cachedSeeder
		}{cd, seeder}
	case isPl:
		return struct {
			*cachedDriver
			cachedPooler
		}{cd, pooler}
	}
	return cd
}

// Get implements runtime.Driver from the cache, reading through on a miss.
func (d *cachedDriver) Get(ctx context.Context, id string) (runtime.Box, error) {
	if box, ok := d.c.get(id); ok {
		return box, nil
	}
	return d.fill(ctx, id)
}

// fill reads id from the runtime and caches it (unless a write raced the read).
func (d *cachedDriver) fill(ctx context.Context, id string) (runtime.Box, error) {
	gen, at := d.c.generation()
	box, err := d.Driver.Get(ctx, id)
	if err == nil {
		d.c.put(box, gen, at)
	}
	return box, err
}

// wrote drops id before a write; the returned function drops it again and announces it.
func (d *cachedDriver) wrote(id string) func() {
	d.c.forget(id)
	return func() {
		d.c.forget(id)
		if d.announce != nil {
			d.announce(id)
		}
	}
}

func (d *cachedDriver) Create(ctx context.Context, rec runtime.Record) error {
	defer d.wrote(rec.ID)()
	return d.Driver.Create(ctx, rec)
}

func (d *cachedDriver) Start(ctx context.Context, id string) (bool, error) {
	defer d.wrote(id)()
	return d.Driver.Start(ctx, id)
}

func (d *cachedDriver) Stop(ctx context.Context, id string) error {
	defer d.wrote(id)()
	return d.Driver.Stop(ctx, id)
}

func (d *cachedDriver) Delete(ctx context.Context, id string) error {
	defer d.wrote(id)()
	defer d.c.untouch(id)
	return d.Driver.Delete(ctx, id)
}

func (d *cachedDriver) UpdateRecord(ctx context.Context, id string, fn func(*runtime.Record) error) (runtime.Record, error) {
	defer d.wrote(id)()
	return d.Driver.UpdateRecord(ctx, id, fn)
}

func (d *cachedDriver) Pause(ctx context.Context, id string) error {
	defer d.wrote(id)()
	return d.Driver.Pause(ctx, id)
}

func (d *cachedDriver) DropMemoryImage(ctx context.Context, id string) error {
	defer d.wrote(id)()
	return d.Driver.DropMemoryImage(ctx, id)
}

func (d *cachedDriver) Resume(ctx context.Context, id string, stored runtime.ImageSource) error {
	defer d.wrote(id)()
	return d.Driver.Resume(ctx, id, stored)
}

// Attach implements runtime.Driver; a box that cannot be attached to is read again next time.
func (d *cachedDriver) Attach(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	rwc, err := d.Driver.Attach(ctx, id)
	if err != nil {
		d.c.forget(id)
	}
	return rwc, err
}

// cachedSeeder is the driver's WorkspaceSeeder with the cache's drops around its writes.
type cachedSeeder struct {
	cd *cachedDriver
	sd runtime.WorkspaceSeeder
}

func (s cachedSeeder) CreateSeeded(ctx context.Context, rec runtime.Record, seed runtime.Seed) error {
	defer s.cd.wrote(rec.ID)()
	return s.sd.CreateSeeded(ctx, rec, seed)
}

func (s cachedSeeder) StartSeeded(ctx context.Context, id string, seed runtime.Seed) (bool, error) {
	defer s.cd.wrote(id)()
	return s.sd.StartSeeded(ctx, id, seed)
}

// cachedPooler is the driver's Pooler with the cache's drops and notices around UpdatePool: a
// claim makes a pool box a sandbox, which every replica's reads must see as such. Pool boxes
// themselves are never cached (the driver's Get and List leave them out, and ListPool is not
// cached).
type cachedPooler struct {
	cd *cachedDriver
	p  runtime.Pooler
}

func (p cachedPooler) ListPool(ctx context.Context) ([]runtime.Box, error) { return p.p.ListPool(ctx) }

func (p cachedPooler) UpdatePool(ctx context.Context, id string, fn func(*runtime.Record) error) (runtime.Record, error) {
	defer p.cd.wrote(id)()
	return p.p.UpdatePool(ctx, id, fn)
}

// cloneBox copies box's maps and slices, so that what a caller does with a box it was given
// never changes the cached one.
func cloneBox(b runtime.Box) runtime.Box {
	r := &b.Record
	r.Annotations = maps.Clone(r.Annotations)
	r.Labels = maps.Clone(r.Labels)
	r.Spec.Env = maps.Clone(r.Spec.Env)
	if p := r.Spec.NetworkPolicy; p != nil {
		c := *p
		c.Allow, c.Deny, c.AlwaysDeny, c.DNS = slices.Clone(p.Allow), slices.Clone(p.Deny), slices.Clone(p.AlwaysDeny), slices.Clone(p.DNS)
		if p.Pinned != nil {
			c.Pinned = make(map[string][]string, len(p.Pinned))
			for k, v := range p.Pinned {
				c.Pinned[k] = slices.Clone(v)
			}
		}
		r.Spec.NetworkPolicy = &c
	}
	return b
}

// announceChange tells the other replicas that sandbox id changed (store.Changed). A notice
// that cannot be sent is logged: the others then see the change within DefaultReadCacheTTL.
func announceChange(st *store.Store, log *slog.Logger, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := st.Changed(ctx, id); err != nil {
		log.Debug("announcing a change failed", "sandbox", id, "err", err)
	}
}

// watchChanges drops the boxes other replicas announce as changed, until the service closes.
func (s *Service) watchChanges() {
	defer close(s.watched)
	s.store.WatchChanges(s.bg, s.cache.forget, s.cache.reset)
}
