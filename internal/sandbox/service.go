// Package sandbox is the lifecycle core of the domain: create, get, list, stop, start, destroy,
// files, status events, snapshots, bootstrap sources, slots, activity and the reconciler, one
// verb per file, and the types both skins speak (exec and agent run types included). It owns
// the rules (the state table, limits, tenancy); the runtime driver owns the boxes and their
// records (the truth), Redis the lookup, events and locks, the checkpoint store the durable
// workspace bytes. Exec (internal/execs) and agent runs (internal/agents) are built on it
// through interfaces they define; it reaches exec only through ExecReconciler. It keeps no
// state another replica needs: only a cache of attach streams to the guest inits of the
// sandboxes it serves.
package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"sandboxd/internal/checkpoint"
	"sandboxd/internal/events"
	"sandboxd/internal/fairshare"
	"sandboxd/internal/quota"
	"sandboxd/internal/source"
	"sandboxd/internal/store"
	"sandboxd/runtime"
)

// Deps are the components the Service works with.
type Deps struct {
	Driver      runtime.Driver
	Store       *store.Store
	Events      *events.Bus
	Checkpoints *checkpoint.Store
	// Quota holds the concurrency slots; nil means no limits.
	Quota *quota.Quota
	// Sources fetches bootstrap archives and GCS prefixes (nil: a Fetcher with the
	// defaults, which allow-lists no host).
	Sources *source.Fetcher
	// SourceObjects lists and reads the objects of a source.gcs_prefix; it is required when
	// Config.SourcePrefixes permits any. It may make its client lazily, on first use.
	SourceObjects source.ObjectLister

	// Resolve resolves host names of egress allow lists (default: NewResolver of
	// Config.Network.DNSServers).
	Resolve Resolver

	// Pooler is the runtime's side of warm pools (nil: the runtime keeps none, and a profile
	// with a warm_pool is a config error). It is the driver itself, unwrapped.
	Pooler runtime.Pooler

	Metrics *Metrics
	Logger  *slog.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Service is the sandbox lifecycle core. Its parts with state or dependencies of their own
// are components: the attach cache, the slots, the checkpoints, the bootstrapper and the
// reconciler.
type Service struct {
	cfg      Config
	profiles map[string]ProfileConfig
	resolve  Resolver
	driver   runtime.Driver
	// raw is the driver without the read cache: what reads after a failure use (Box).
	raw   runtime.Driver
	cache *boxCache
	// watched ends when the watch of other replicas' changes (watchChanges) has stopped.
	watched chan struct{}
	store   *store.Store
	events  *events.Bus
	metrics *Metrics
	log     *slog.Logger
	now     func() time.Time

	attachs *attachments
	slots   slots
	ckpts   *checkpoints
	mem     *memories
	boot    *bootstrapper
	recon   *reconciler
	// pool keeps the warm boxes of the profiles that have a warm_pool (pool.go); nil: none.
	pool *pool
	// streams caps the event and output streams each tenant:project holds on this replica.
	streams *fairshare.Limiter

	// bg lives as long as the service: the starts of sandboxes whose compute was lost run on
	// it, not on a request; recovering waits for them (recoverLost).
	bg         context.Context
	cancel     context.CancelFunc
	recovering sync.WaitGroup
	// chores are background work that follows an answer (pause.go); Close waits for them.
	chores sync.WaitGroup
	// memStores are the stores of pauses' memory images, by "<sandbox>/<pause>" (pause.go).
	memStores tries
	// owedPays are the tries of the checkpoints stops owe, by sandbox id (stopstart.go).
	owedPays tries
}

// New returns a Service.
func New(cfg Config, d Deps) (*Service, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if d.Driver == nil || d.Store == nil || d.Events == nil || d.Checkpoints == nil {
		return nil, errors.New("sandbox: driver, store, events and checkpoints are required")
	}
	if d.Sources == nil {
		f, err := source.New(source.Options{})
		if err != nil {
			return nil, err
		}
		d.Sources = f
	}
	if len(cfg.SourcePrefixes) > 0 && d.SourceObjects == nil {
		return nil, errors.New("sandbox: source prefixes are permitted but there is no object lister (Deps.SourceObjects)")
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Metrics == nil {
		d.Metrics = NewMetrics(nil)
	}
	cache := newBoxCache(cfg.ReadCacheTTL, cfg.ReadCacheEntries, time.Now)
	raw := d.Driver
	cd := &cachedDriver{Driver: raw, c: cache, announce: func(id string) { announceChange(d.Store, d.Logger, id) }}
	d.Driver = cd.wrap()
	_, sharedPools := d.Pooler.(runtime.SharedPooler)
	if d.Pooler != nil {
		// The pools' claims go through the cache too (the Pooler given may not be the driver).
		d.Pooler = cachedPooler{cd: cd, p: d.Pooler}
	}
	s := &Service{cfg: cfg, profiles: map[string]ProfileConfig{}, driver: d.Driver, raw: raw, cache: cache, store: d.Store, events: d.Events,
		metrics: d.Metrics, log: d.Logger, now: d.Now, streams: fairshare.New(cfg.MaxStreamsPerProject),
		memStores: tries{retry: memoryStoreRetry}, owedPays: tries{retry: owedRetry}}
	s.resolve = d.Resolve
	if s.resolve == nil {
		s.resolve = NewResolver(cfg.Network.DNSServers)
	}
	s.attachs = newAttachments(raw, s.Observe)
	s.slots = slots{quota: d.Quota, driver: raw, log: d.Logger, metrics: d.Metrics}
	s.ckpts = &checkpoints{store: d.Checkpoints, driver: d.Driver, attachs: s.attachs, metrics: d.Metrics, log: d.Logger,
		now: d.Now, keep: cfg.KeepCheckpoints}
	s.mem = &memories{store: d.Checkpoints.Derive(MemoryPrefix), driver: d.Driver, log: d.Logger}
	s.boot = &bootstrapper{sources: d.Sources, objects: d.SourceObjects, prefixes: cfg.SourcePrefixes, ckpts: s.ckpts,
		attachs: s.attachs, driver: d.Driver, events: d.Events, metrics: d.Metrics, log: d.Logger, now: d.Now,
		every: defaultProgressEvery}
	s.recon = &reconciler{s: s}
	s.bg, s.cancel = context.WithCancel(context.Background())
	s.watched = make(chan struct{})
	go s.watchChanges()
	for _, p := range cfg.Profiles {
		s.profiles[p.Name] = p
	}
	pl, err := newPool(s, d.Pooler, sharedPools)
	if err != nil {
		s.cancel()
		return nil, err
	}
	s.pool = pl
	if s.pool != nil {
		go s.pool.run(s.bg)
	}
	return s, nil
}

// Limits returns the configured limits.
func (s *Service) Limits() Limits { return s.cfg.Limits }

// Config is the config as New checked it, every default filled in: what exec and agent runs
// are configured from.
func (s *Service) Config() Config { return s.cfg }

// Close waits for the starts of lost sandboxes this replica began and drops every attach
// stream it holds. Sandboxes and commands keep running.
func (s *Service) Close() {
	s.cancel()
	<-s.watched
	if s.pool != nil {
		<-s.pool.done // its boxes retired
	}
	s.recovering.Wait()
	s.chores.Wait()
	s.attachs.closeAll()
}

// Profiles lists the profiles a caller may create.
func (s *Service) Profiles() []Profile {
	out := make([]Profile, 0, len(s.cfg.Profiles))
	for _, p := range s.cfg.Profiles {
		out = append(out, Profile{Name: p.Name, Description: p.Description, MilliCPU: p.MilliCPU,
			MemoryBytes: p.MemoryMB << 20, DiskBytes: p.DiskMB << 20, Network: network(p.Network),
			NetworkPolicy: s.profilePolicy(p), Default: p.Name == s.cfg.DefaultProfile})
	}
	return out
}

func network(n string) string {
	if n == "" {
		return "none"
	}
	return n
}
