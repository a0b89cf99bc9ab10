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

	Metrics *Metrics
	Logger  *slog.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Service is the sandbox lifecycle core.
type Service struct {
	cfg      Config
	profiles map[string]ProfileConfig
	driver   runtime.Driver
	store    *store.Store
	events   *events.Bus
	ckpt     *checkpoint.Store
	quota    *quota.Quota
	sources  *source.Fetcher
	objects  source.ObjectLister
	metrics  *Metrics
	log      *slog.Logger
	now      func() time.Time
	// progressEvery is how often a bootstrap's progress is recorded and published.
	progressEvery time.Duration

	// bg lives as long as the service: the starts of sandboxes whose compute was lost run on
	// it, not on a request; recovering waits for them (recoverLost).
	bg         context.Context
	cancel     context.CancelFunc
	recovering sync.WaitGroup
	// execs is the exec side of every reconcile pass (SetExecReconciler).
	execs ExecReconciler
	// streams caps the event and output streams each tenant:project holds on this replica.
	streams *fairshare.Limiter

	mu      sync.Mutex
	attachs map[string]*attachment
}

// New returns a Service.
func New(cfg Config, d Deps) (*Service, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if d.Driver == nil || d.Store == nil || d.Events == nil || d.Checkpoints == nil {
		return nil, errors.New("sandbox: driver, store, events and checkpoints are required")
	}
	s := &Service{cfg: cfg, profiles: map[string]ProfileConfig{}, driver: d.Driver, store: d.Store,
		events: d.Events, ckpt: d.Checkpoints, quota: d.Quota, sources: d.Sources, objects: d.SourceObjects,
		metrics: d.Metrics, log: d.Logger, now: d.Now, progressEvery: defaultProgressEvery,
		attachs: map[string]*attachment{},
		streams: fairshare.New(cfg.MaxStreamsPerProject)}
	if s.sources == nil {
		f, err := source.New(source.Options{})
		if err != nil {
			return nil, err
		}
		s.sources = f
	}
	if len(cfg.SourcePrefixes) > 0 && s.objects == nil {
		return nil, errors.New("sandbox: source prefixes are permitted but there is no object lister (Deps.SourceObjects)")
	}
	s.bg, s.cancel = context.WithCancel(context.Background())
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.metrics == nil {
		s.metrics = NewMetrics(nil)
	}
	for _, p := range cfg.Profiles {
		s.profiles[p.Name] = p
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
	s.recovering.Wait()
	s.mu.Lock()
	as := s.attachs
	s.attachs = map[string]*attachment{}
	s.mu.Unlock()
	for _, a := range as {
		a.close()
	}
}

// Profiles lists the profiles a caller may create.
func (s *Service) Profiles() []Profile {
	out := make([]Profile, 0, len(s.cfg.Profiles))
	for _, p := range s.cfg.Profiles {
		out = append(out, Profile{Name: p.Name, Description: p.Description, MilliCPU: p.MilliCPU,
			MemoryBytes: p.MemoryMB << 20, DiskBytes: p.DiskMB << 20, Network: network(p.Network),
			Default: p.Name == s.cfg.DefaultProfile})
	}
	return out
}

func network(n string) string {
	if n == "" {
		return "none"
	}
	return n
}
