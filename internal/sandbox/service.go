// Package sandbox is the domain service: sandbox lifecycle, exec and files, behind both REST and
// GraphQL. It owns the rules (the state table, limits, tenancy); the runtime driver owns the
// boxes and their records (the truth), Redis the lookup, events and locks, the checkpoint store
// the durable workspace bytes. It keeps no state another replica needs: only a cache of attach
// streams to the guest inits of the sandboxes it serves.
package sandbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/internal/agentrun"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/checkpoint"
	"sandboxd/internal/events"
	"sandboxd/internal/execstream"
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
	// Execs keeps exec output streams and status.
	Execs *execstream.Store
	// AgentRuns keeps agent run records (nil: agent runs answer UNAVAILABLE).
	AgentRuns *agentrun.Store
	// ReplicaToken names this replica as an exec follower (a fresh random one when empty).
	ReplicaToken string
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

// Service is the domain service.
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

	execs *execstream.Store
	runs  *agentrun.Store
	// agents is the catalog by id.
	agents map[string]AgentConfig
	token  string
	// bg lives as long as the service: exec followers run on it, not on a request.
	bg        context.Context
	cancel    context.CancelFunc
	followers sync.WaitGroup
	// recovering are the starts of sandboxes whose compute was lost (recoverLost).
	recovering sync.WaitGroup
	followMu   sync.Mutex
	following  map[string]bool // exec ids this replica follows
	execSubs   atomic.Int64
	lastSweep  atomic.Int64
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
	if d.Driver == nil || d.Store == nil || d.Events == nil || d.Checkpoints == nil || d.Execs == nil {
		return nil, errors.New("sandbox: driver, store, events, checkpoints and execs are required")
	}
	s := &Service{cfg: cfg, profiles: map[string]ProfileConfig{}, driver: d.Driver, store: d.Store,
		events: d.Events, ckpt: d.Checkpoints, quota: d.Quota, sources: d.Sources, objects: d.SourceObjects,
		metrics: d.Metrics, log: d.Logger, now: d.Now, progressEvery: defaultProgressEvery,
		execs: d.Execs, runs: d.AgentRuns, agents: map[string]AgentConfig{}, token: d.ReplicaToken, following: map[string]bool{}, attachs: map[string]*attachment{},
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
	if s.token == "" {
		s.token = "replica_" + ulid.Make().String()
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
	for _, a := range cfg.Agents {
		s.agents[a.ID] = a
	}
	return s, nil
}

// Limits returns the configured limits.
func (s *Service) Limits() Limits { return s.cfg.Limits }

// Close stops following execs (their leases are released, so another replica follows on at
// once) and drops every attach stream this replica holds. Sandboxes and commands keep running.
func (s *Service) Close() {
	s.cancel()
	s.followers.Wait()
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

// ---- ids ----

const idPrefix = "sbx_"

func newID(prefix string) string { return prefix + ulid.Make().String() }

// validID reports whether id has the shape of a sandbox id, so that junk never reaches Redis or
// the runtime.
func validID(id string) bool { return validPrefixedID(id, idPrefix) }

// validPrefixedID reports whether id is prefix followed by a ULID (sandbox and exec ids).
func validPrefixedID(id, prefix string) bool {
	if len(id) != len(prefix)+26 || !strings.HasPrefix(id, prefix) {
		return false
	}
	_, err := ulid.ParseStrict(id[len(prefix):])
	return err == nil
}

func notFound(id string) error {
	return apierror.New(apierror.NotFound, "sandbox %s not found", truncate(id, 64))
}

// ---- create ----

// Create creates a sandbox and returns it RUNNING.
func (s *Service) Create(ctx context.Context, p auth.Principal, req CreateRequest) (Sandbox, error) {
	start := s.now()
	prof, autostop, ttl, err := s.validateCreate(req)
	if err != nil {
		return Sandbox{}, err
	}
	// The source is checked before a slot is taken: a missing snapshot, a refused URL or a
	// prefix the project may not use costs nothing.
	src, err := s.createSource(ctx, p, req.Source, prof.DiskMB<<20)
	if err != nil {
		return Sandbox{}, err
	}
	env := map[string]string{}
	for k, v := range prof.Env {
		env[k] = v
	}
	for k, v := range req.Env {
		env[k] = v
	}
	id := newID(idPrefix)
	if err := s.acquire(ctx, p.Tenant, p.Project, id); err != nil {
		return Sandbox{}, err
	}
	// The create holds the sandbox's lock: a reconciler that can take it knows a CREATING
	// record's creator is gone and finishes (or fails) the create.
	lock, err := s.store.Lock(ctx, id, s.cfg.LockTTL)
	if err != nil {
		s.release(ctx, p.Tenant, p.Project, id)
		return Sandbox{}, apierror.Wrap(err, apierror.Unavailable, "the sandbox store is unavailable")
	}
	defer lock.Unlock(ctx)
	ctx = runtime.WithFence(ctx, lock.Fence())
	now := s.now().UTC()
	rec := runtime.Record{
		ID: id, Tenant: p.Tenant, Project: p.Project,
		Spec: runtime.BoxSpec{Profile: prof.Name, Rootfs: prof.Rootfs, Image: prof.Image, MilliCPU: prof.MilliCPU,
			MemoryBytes: prof.MemoryMB << 20, DiskBytes: prof.DiskMB << 20, Network: network(prof.Network), Env: env},
		State: string(Creating), DesiredState: string(Running), AutostopSec: autostop, TTLSec: ttl,
		CreatedAt: now, StateChangedAt: now,
	}
	if src.key != "" {
		// Recorded before the box exists, so that a reconciler finishing this create fills
		// the workspace from it too (and a snapshot is the first checkpoint's parent).
		rec.Annotations = map[string]string{src.key: src.value}
	}
	// The lookup first: a replica that dies after this leaves an entry whose box may not
	// exist, which Get cleans up; the reverse order could leave a box nobody can find.
	if err := s.store.Put(ctx, entryOf(rec)); err != nil {
		s.release(ctx, p.Tenant, p.Project, id)
		return Sandbox{}, apierror.Wrap(err, apierror.Unavailable, "the sandbox store is unavailable")
	}
	s.touch(ctx, id)
	s.publish(ctx, rec, "")
	if err := s.driver.Create(ctx, rec); err != nil {
		s.abortCreate(ctx, rec, start)
		return Sandbox{}, s.runtimeFailed(rec.ID, err, "could not create the sandbox: the runtime failed to start it")
	}
	if src.key != "" {
		// Fetched once, streamed into the workspace before the sandbox is RUNNING.
		if err := s.restoreSource(ctx, rec); err != nil {
			s.abortCreate(ctx, rec, start)
			return Sandbox{}, err
		}
	}
	rec, err = s.setState(ctx, rec.ID, Creating, Running, "")
	if err != nil {
		return Sandbox{}, err
	}
	s.metrics.lifecycle("create", "ok", s.now().Sub(start))
	s.log.Info("sandbox created", "sandbox", rec.ID, "tenant", p.Tenant, "project", p.Project, "profile", prof.Name,
		"ms", s.now().Sub(start).Milliseconds())
	return toSandbox(rec), nil
}

// abortCreate removes what a failed create made: the box, the lookup and the slot. A box
// whose delete was fenced off is another replica's now (it finished the create after this
// one's lock ran out): its lookup and slot stay.
func (s *Service) abortCreate(ctx context.Context, rec runtime.Record, start time.Time) {
	cleanup := context.WithoutCancel(ctx)
	s.dropAttach(rec.ID)
	if err := s.driver.Delete(cleanup, rec.ID); errors.Is(err, runtime.ErrFenced) {
		s.log.Warn("a failed create's cleanup was fenced off: another replica took over the sandbox", "sandbox", rec.ID, "err", err)
		s.metrics.lifecycle("create", "error", s.now().Sub(start))
		return
	} else if err != nil {
		s.log.Error("cleaning up a failed create", "sandbox", rec.ID, "err", err)
	}
	_ = s.store.Delete(cleanup, entryOf(rec))
	_ = s.store.ForgetActivity(cleanup, rec.ID)
	s.release(cleanup, rec.Tenant, rec.Project, rec.ID)
	s.metrics.lifecycle("create", "error", s.now().Sub(start))
}

func (s *Service) validateCreate(req CreateRequest) (ProfileConfig, int64, int64, error) {
	name := req.Profile
	if name == "" {
		name = s.cfg.DefaultProfile
	}
	prof, ok := s.profiles[name]
	if !ok {
		names := make([]string, 0, len(s.cfg.Profiles))
		for _, p := range s.cfg.Profiles {
			names = append(names, p.Name)
		}
		return prof, 0, 0, apierror.New(apierror.InvalidArgument, "unknown profile %q: one of %s", name, strings.Join(names, ", "))
	}
	l := s.cfg.Limits
	autostop, err := bounded("autostop_sec", req.AutostopSec, l.AutostopDefaultSec, l.AutostopMinSec, l.AutostopMaxSec)
	if err != nil {
		return prof, 0, 0, err
	}
	ttl, err := bounded("ttl_sec", req.TTLSec, l.TTLDefaultSec, l.TTLMinSec, l.TTLMaxSec)
	if err != nil {
		return prof, 0, 0, err
	}
	if err := s.validateEnv(req.Env); err != nil {
		return prof, 0, 0, err
	}
	return prof, autostop, ttl, nil
}

func bounded(name string, v *int64, def, min, max int64) (int64, error) {
	if v == nil {
		return def, nil
	}
	if *v < min || *v > max {
		return 0, apierror.New(apierror.InvalidArgument, "%s must be between %d and %d, got %d", name, min, max, *v).
			WithDetail("field", name)
	}
	return *v, nil
}

func (s *Service) validateEnv(env map[string]string) error {
	if len(env) > s.cfg.Limits.ExecMaxEnv {
		return apierror.New(apierror.InvalidArgument, "at most %d environment variables, got %d", s.cfg.Limits.ExecMaxEnv, len(env))
	}
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) || len(k)+len(v) > 32<<10 {
			return apierror.New(apierror.InvalidArgument, "invalid environment variable %q: names must be non-empty without '=' or NUL, values without NUL, each at most 32 KiB", truncate(k, 64))
		}
		if strings.HasPrefix(k, "SBX_") {
			return apierror.New(apierror.InvalidArgument, "environment variable %s is reserved: names starting with SBX_ belong to the guest init", truncate(k, 64))
		}
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// ---- read ----

// Get returns one of the caller's sandboxes.
func (s *Service) Get(ctx context.Context, p auth.Principal, id string) (Sandbox, error) {
	rec, err := s.load(ctx, p, id, VerbGet)
	if err != nil {
		return Sandbox{}, err
	}
	return s.withActivity(ctx, toSandbox(rec)), nil
}

// List returns a page of the caller's sandboxes, newest first.
func (s *Service) List(ctx context.Context, p auth.Principal, opts ListOptions) (Page, error) {
	limit := opts.Limit
	if limit <= 0 {
		limit = 50
	}
	if limit > s.cfg.Limits.MaxPageSize {
		return Page{}, apierror.New(apierror.InvalidArgument, "page size must be at most %d, got %d", s.cfg.Limits.MaxPageSize, limit)
	}
	if opts.After != "" && !validID(opts.After) {
		return Page{}, apierror.New(apierror.InvalidArgument, "malformed cursor %q", truncate(opts.After, 64))
	}
	if opts.State != "" {
		if _, err := ParseState(string(opts.State)); err != nil {
			return Page{}, err
		}
	}
	var page Page
	after := opts.After
	// Read the index in batches until the page is full; with a state filter this may take
	// several batches, bounded so one call never scans a whole huge project.
	for scanned := 0; len(page.Sandboxes) < limit && scanned < 20*limit+1000; {
		batch := limit + 1
		entries, err := s.store.List(ctx, p.Tenant, p.Project, after, batch)
		if err != nil {
			return Page{}, apierror.Wrap(err, apierror.Unavailable, "the sandbox store is unavailable")
		}
		scanned += len(entries)
		for _, e := range entries {
			after = e.ID
			if State(e.State) == Destroyed || (opts.State != "" && State(e.State) != opts.State) {
				continue
			}
			if len(page.Sandboxes) == limit {
				page.NextCursor = page.Sandboxes[limit-1].ID
				s.withActivities(ctx, page.Sandboxes)
				return page, nil
			}
			rec, err := s.driver.Get(ctx, e.ID)
			if errors.Is(err, runtime.ErrNotFound) {
				continue
			}
			if err != nil {
				return Page{}, apierror.Wrap(err, apierror.Unavailable, "the runtime is unavailable")
			}
			sb := toSandbox(s.observe(ctx, rec))
			if opts.State != "" && sb.State != opts.State {
				continue
			}
			page.Sandboxes = append(page.Sandboxes, sb)
		}
		if len(entries) < batch {
			break
		}
	}
	if len(page.Sandboxes) == limit && after != page.Sandboxes[limit-1].ID {
		page.NextCursor = page.Sandboxes[limit-1].ID
	}
	s.withActivities(ctx, page.Sandboxes)
	return page, nil
}

// load finds the caller's sandbox id and checks verb against its state. Another project's
// sandbox, a malformed id and a missing one are all NOT_FOUND.
func (s *Service) load(ctx context.Context, p auth.Principal, id string, verb Verb) (runtime.Record, error) {
	if !validID(id) {
		return runtime.Record{}, notFound(id)
	}
	e, err := s.store.Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return runtime.Record{}, notFound(id)
	}
	if err != nil {
		return runtime.Record{}, apierror.Wrap(err, apierror.Unavailable, "the sandbox store is unavailable")
	}
	if e.Tenant != p.Tenant || e.Project != p.Project {
		return runtime.Record{}, notFound(id)
	}
	box, err := s.driver.Get(ctx, id)
	if errors.Is(err, runtime.ErrNotFound) {
		// The lookup outlived the box (a create that died half way, a destroy elsewhere).
		_ = s.store.Delete(ctx, e)
		return runtime.Record{}, notFound(id)
	}
	if err != nil {
		return runtime.Record{}, apierror.Wrap(err, apierror.Unavailable, "the runtime is unavailable")
	}
	if box.Record.Tenant != p.Tenant || box.Record.Project != p.Project {
		return runtime.Record{}, notFound(id)
	}
	rec := s.observe(ctx, box)
	if p.Key != systemKey {
		s.touch(ctx, id)
	}
	if err := Check(State(rec.State), verb, id); err != nil {
		if State(rec.State) == Failed && rec.StateReason != "" {
			if e := apierror.From(err); e.Code == apierror.InvalidState {
				e.Message += ": " + rec.StateReason
			}
		}
		return rec, err
	}
	return rec, nil
}

// observe reconciles a record with what the driver sees: a box whose compute died while it was
// RUNNING is FAILED with the driver's reason, and that is written back to the record.
func (s *Service) observe(ctx context.Context, box runtime.Box) runtime.Record {
	rec := box.Record
	if diedRunning(box) {
		reason := box.Reason
		if reason == "" {
			reason = "the sandbox's runtime died"
		}
		updated, err := s.setState(ctx, rec.ID, Running, Failed, reason)
		if err == nil {
			s.dropAttach(rec.ID)
			s.release(ctx, rec.Tenant, rec.Project, rec.ID)
			s.log.Warn("sandbox failed", "sandbox", rec.ID, "reason", reason, "lost", box.Lost)
			if box.Lost {
				s.recoverLost(updated)
			}
			return updated
		}
		rec.State, rec.StateReason = string(Failed), reason
	}
	return rec
}

// recoverLost starts a sandbox again whose compute the runtime lost (its pod deleted or
// evicted: the workspace is intact), on the service's lifetime. Only the replica whose write
// made it FAILED does this; it stays FAILED, with the reason, when the start cannot be done
// (the project's slots are full, the cluster cannot schedule it), for a caller to start later.
func (s *Service) recoverLost(rec runtime.Record) {
	s.recovering.Add(1)
	go func() {
		defer s.recovering.Done()
		p := auth.Principal{Key: systemKey, Tenant: rec.Tenant, Project: rec.Project}
		if _, err := s.Start(s.bg, p, rec.ID); err != nil {
			s.log.Warn("could not start again a sandbox whose compute was lost", "sandbox", rec.ID, "err", err)
			return
		}
		s.log.Info("started again a sandbox whose compute was lost", "sandbox", rec.ID)
	}()
}

// diedRunning reports a box whose compute died while its record says RUNNING: it is FAILED.
func diedRunning(b runtime.Box) bool {
	return b.Phase == runtime.PhaseFailed && State(b.Record.State) == Running
}

// ---- state changes ----

// setState moves a sandbox's record from one state to another (only if it is still in from),
// updates the lookup and publishes the event.
func (s *Service) setState(ctx context.Context, id string, from, to State, reason string) (runtime.Record, error) {
	ctx = context.WithoutCancel(ctx)
	rec, err := s.driver.UpdateRecord(ctx, id, func(r *runtime.Record) error {
		if State(r.State) != from {
			return apierror.New(apierror.InvalidState, "sandbox %s is %s, not %s", id, r.State, from).WithDetail("state", r.State)
		}
		r.State = string(to)
		r.StateReason = reason
		r.StateChangedAt = s.now().UTC()
		switch to {
		case Running, Stopped, Destroyed:
			r.DesiredState = string(to)
		case Starting:
			r.DesiredState = string(Running)
		case Stopping:
			r.DesiredState = string(Stopped)
		case Destroying:
			r.DesiredState = string(Destroyed)
		}
		return nil
	})
	if err != nil {
		if apierror.Is(err, apierror.InvalidState) {
			return rec, err
		}
		return rec, s.runtimeError(id, err, "could not record the sandbox's state")
	}
	if err := s.store.SetState(ctx, id, string(to)); errors.Is(err, store.ErrNotFound) {
		_ = s.store.Put(ctx, entryOf(rec))
	} else if err != nil {
		s.log.Warn("lookup state update failed; it is rebuilt from the runtime", "sandbox", id, "err", err)
	}
	s.publish(ctx, rec, from)
	return rec, nil
}

func (s *Service) publish(ctx context.Context, rec runtime.Record, prev State) {
	ev := events.Event{Type: EventStateChanged, SandboxID: rec.ID, At: s.now().UTC(),
		Fields: map[string]string{"state": rec.State, "previous_state": string(prev), "reason": rec.StateReason}}
	if _, err := s.events.Publish(context.WithoutCancel(ctx), rec.Tenant, rec.Project, ev); err != nil {
		s.log.Warn("publishing a sandbox event failed", "sandbox", rec.ID, "err", err)
	}
}

// transition runs a stateful verb: it takes the sandbox's operation lock, checks the table,
// moves the record to the verb's transient state, runs work and moves it to the target state
// (or back, when work fails and says so).
func (s *Service) transition(ctx context.Context, p auth.Principal, id string, verb Verb,
	work func(ctx context.Context, rec runtime.Record) (reason string, err error)) (runtime.Record, error) {
	start := s.now()
	if _, err := s.load(ctx, p, id, verb); err != nil {
		return runtime.Record{}, err
	}
	lock, err := s.lock(ctx, id)
	if err != nil {
		return runtime.Record{}, err
	}
	defer lock.Unlock(ctx)
	ctx = runtime.WithFence(ctx, lock.Fence())
	// Load again under the lock: the state may have moved while we waited.
	rec, err := s.load(ctx, p, id, verb)
	if err != nil {
		return runtime.Record{}, err
	}
	transient, target, _ := verb.transient()
	from := State(rec.State)
	if rec, err = s.setState(ctx, id, from, transient, ""); err != nil {
		return rec, err
	}
	// The work must finish even if the client goes away: the record says where it is going.
	wctx := context.WithoutCancel(ctx)
	reason, werr := work(wctx, rec)
	if errors.Is(werr, runtime.ErrFenced) {
		// Another replica took the sandbox over after our lock ran out: it is that one's to
		// move on (or back), and our writes would be refused anyway.
		s.metrics.lifecycle(string(verb), "error", s.now().Sub(start))
		return rec, werr
	}
	if werr != nil {
		var back State
		switch verb {
		case VerbStart:
			back, reason = Failed, "start failed: "+apierror.From(werr).Message
		default:
			back = from
		}
		if _, err := s.setState(wctx, id, transient, back, reason); err != nil {
			s.log.Error("could not roll a failed transition back", "sandbox", id, "verb", verb, "err", err)
		}
		s.metrics.lifecycle(string(verb), "error", s.now().Sub(start))
		return rec, werr
	}
	if target == Destroyed {
		s.metrics.lifecycle(string(verb), "ok", s.now().Sub(start))
		return rec, nil
	}
	rec, err = s.setState(wctx, id, transient, target, reason)
	s.metrics.lifecycle(string(verb), outcome(err), s.now().Sub(start))
	return rec, err
}

// lock takes the sandbox's operation lock; a held one is INVALID_STATE with Retry-After. The
// caller makes its driver writes with the lock's fence (runtime.WithFence).
func (s *Service) lock(ctx context.Context, id string) (*store.Lock, error) {
	lock, err := s.store.Lock(ctx, id, s.cfg.LockTTL)
	if errors.Is(err, store.ErrLocked) {
		return nil, apierror.New(apierror.InvalidState, "sandbox %s: another operation is in flight, retry shortly", id).
			WithRetryAfter(busyRetryAfter)
	}
	if err != nil {
		return nil, apierror.Wrap(err, apierror.Unavailable, "the sandbox store is unavailable")
	}
	return lock, nil
}

// runtimeError is the error of a failed driver write to sandbox id: fencedOff's when the
// runtime refused the write for its fence, else UNAVAILABLE with msg.
func (s *Service) runtimeError(id string, err error, msg string) error {
	if errors.Is(err, runtime.ErrFenced) {
		return s.fencedOff(id, err)
	}
	return apierror.Wrap(err, apierror.Unavailable, "%s", msg)
}

// fencedOff is the error of a driver write that the runtime refused because it carried an
// older fence than one the box has seen (runtime.ErrFenced): this replica's lock on the
// sandbox ran out while the operation was held up (a GC pause, a stopped process, a slow
// disk), and another replica took the lock and acted. Nothing was changed by the write.
//
// It is INVALID_STATE with Retry-After, the answer to a lock another operation holds: that is
// what happened, found out later (the sandbox is in another operation's hands, and a retry is
// checked against the state that one leaves), and the reconciler already takes INVALID_STATE
// for "another replica got there first". UNAVAILABLE would blame a component that is down;
// none is.
func (s *Service) fencedOff(id string, err error) error {
	s.log.Warn("a runtime write was fenced off: this replica's operation lock ran out and another replica took the sandbox over",
		"sandbox", id, "err", err)
	return apierror.Wrap(err, apierror.InvalidState, "sandbox %s: another replica took over this sandbox's operation; retry", id).
		WithRetryAfter(busyRetryAfter)
}

func outcome(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// Stop checkpoints the workspace and releases the sandbox's compute and slot.
func (s *Service) Stop(ctx context.Context, p auth.Principal, id string) (Sandbox, error) {
	return s.stop(ctx, p, id, "")
}

func (s *Service) stop(ctx context.Context, p auth.Principal, id, why string) (Sandbox, error) {
	rec, err := s.transition(ctx, p, id, VerbStop, func(ctx context.Context, rec runtime.Record) (string, error) {
		reason, err := s.stopWork(ctx, rec)
		if reason == "" {
			reason = why
		}
		if err == nil {
			// The compute is gone: the slot goes back before STOPPED is recorded, so that
			// nobody who sees STOPPED still finds it counted (as destroy does).
			s.release(ctx, rec.Tenant, rec.Project, id)
		}
		return reason, err
	})
	if err != nil {
		return Sandbox{}, err
	}
	return toSandbox(rec), nil
}

// stopWork checkpoints the workspace and stops the box.
func (s *Service) stopWork(ctx context.Context, rec runtime.Record) (string, error) {
	reason := ""
	if _, err := s.checkpoint(ctx, rec); err != nil {
		if !s.boxDead(ctx, rec.ID) {
			return "", err
		}
		// A dead box has no guest to stream from: its workspace is kept by the runtime and
		// the last checkpoint stays the latest.
		reason = "stopped without a new checkpoint: the sandbox's runtime had died"
	}
	s.dropAttach(rec.ID)
	if err := s.driver.Stop(ctx, rec.ID); err != nil {
		return "", s.runtimeError(rec.ID, err, "could not stop the sandbox's runtime")
	}
	return reason, nil
}

// Start takes a concurrency slot, restores the workspace if the runtime lost it and starts the
// sandbox's compute.
func (s *Service) Start(ctx context.Context, p auth.Principal, id string) (Sandbox, error) {
	if _, err := s.load(ctx, p, id, VerbStart); err != nil {
		return Sandbox{}, err
	}
	if err := s.acquire(ctx, p.Tenant, p.Project, id); err != nil {
		return Sandbox{}, err
	}
	rec, err := s.transition(ctx, p, id, VerbStart, func(ctx context.Context, rec runtime.Record) (string, error) {
		return "", s.startWork(ctx, rec)
	})
	if err != nil {
		s.releaseUnlessHolding(ctx, p.Tenant, p.Project, id)
		return Sandbox{}, err
	}
	return toSandbox(rec), nil
}

// runtimeFailed is the error of a driver's failed create or start of sandbox id. When the box
// cannot run as specified (a pod the cluster cannot schedule, an image that cannot run) it
// says why.
func (s *Service) runtimeFailed(id string, err error, msg string) error {
	if errors.Is(err, runtime.ErrFenced) {
		return s.fencedOff(id, err)
	}
	if se, ok := errors.AsType[*runtime.StartError](err); ok {
		return apierror.Wrap(err, apierror.Unavailable, "%s: %s", msg, se.Reason)
	}
	return apierror.Wrap(err, apierror.Unavailable, "%s", msg)
}

// startWork starts the box and restores its workspace when the runtime lost it.
func (s *Service) startWork(ctx context.Context, rec runtime.Record) error {
	s.dropAttach(rec.ID)
	fresh, err := s.driver.Start(ctx, rec.ID)
	if err != nil {
		return s.runtimeFailed(rec.ID, err, "could not start the sandbox's runtime")
	}
	if !fresh {
		return nil
	}
	if rec.LatestCheckpoint != "" {
		return s.restore(ctx, rec.ID, scopeOf(rec), rec.LatestCheckpoint)
	}
	// Never checkpointed (its only stop found the box dead): the workspace it started from
	// is its source, fetched again for an archive or prefix.
	return s.restoreSource(ctx, rec)
}

// Destroy checkpoints the workspace (when the sandbox runs), removes the runtime and answers
// with the final snapshot id.
func (s *Service) Destroy(ctx context.Context, p auth.Principal, id string) (DestroyResult, error) {
	return s.destroy(ctx, p, id, Destroyed, "")
}

// destroy is Destroy; final is the state the last event reports (DESTROYED, or EXPIRED when the
// TTL ended it).
func (s *Service) destroy(ctx context.Context, p auth.Principal, id string, final State, why string) (DestroyResult, error) {
	var snapshot string
	rec, err := s.transition(ctx, p, id, VerbDestroy, func(ctx context.Context, rec runtime.Record) (string, error) {
		var err error
		snapshot, err = s.destroyWork(ctx, rec, final, why)
		return "", err
	})
	if err != nil {
		return DestroyResult{}, err
	}
	rec.LatestCheckpoint = snapshot
	rec.State = string(final)
	rec.StateReason = why
	return DestroyResult{Sandbox: toSandbox(rec), SnapshotID: snapshot}, nil
}

// destroyWork takes the final checkpoint, removes the box, the lookup and the slot, and
// publishes the final event. It returns the final snapshot id.
func (s *Service) destroyWork(ctx context.Context, rec runtime.Record, final State, why string) (string, error) {
	id := rec.ID
	snapshot := rec.LatestCheckpoint
	box, err := s.driver.Get(ctx, id)
	_, exporter := s.driver.(runtime.WorkspaceExporter)
	// A running box is checkpointed; so is a failed one whose workspace the driver can
	// still read. A stopped box's latest checkpoint was taken when it stopped.
	if err == nil && (box.Phase == runtime.PhaseRunning || (exporter && box.Phase == runtime.PhaseFailed)) {
		m, err := s.checkpoint(ctx, rec)
		if err != nil && !s.boxDead(ctx, id) {
			return "", err
		}
		if err == nil {
			snapshot = m.ID
		}
	}
	s.dropAttach(id)
	if err := s.driver.Delete(ctx, id); err != nil {
		return "", s.runtimeError(id, err, "could not remove the sandbox's runtime")
	}
	if err := s.store.Delete(ctx, entryOf(rec)); err != nil {
		s.log.Warn("removing the lookup failed; the next read cleans it", "sandbox", id, "err", err)
	}
	_ = s.store.ForgetActivity(ctx, id)
	s.release(ctx, rec.Tenant, rec.Project, id)
	rec.State, rec.StateReason = string(final), why
	s.publish(ctx, rec, Destroying)
	return snapshot, nil
}

// boxDead reports whether the box's compute is gone (so no checkpoint can be taken).
func (s *Service) boxDead(ctx context.Context, id string) bool {
	box, err := s.driver.Get(ctx, id)
	return err == nil && box.Phase != runtime.PhaseRunning
}

// checkpoint streams the workspace from the guest into the checkpoint store, records it as
// the latest checkpoint and applies retention. The caller holds the sandbox's lock.
func (s *Service) checkpoint(ctx context.Context, rec runtime.Record) (checkpoint.Manifest, error) {
	start := s.now()
	tarStream, err := s.exportWorkspace(ctx, rec.ID)
	if err != nil {
		return checkpoint.Manifest{}, err
	}
	defer tarStream.Close()
	parent := rec.LatestCheckpoint
	if parent == "" {
		parent = sourceOf(rec)
	}
	m, err := s.ckpt.Save(ctx, scopeOf(rec), tarStream, parent)
	if err != nil {
		return checkpoint.Manifest{}, apierror.Wrap(err, apierror.Unavailable, "could not write the workspace checkpoint")
	}
	if _, err := s.driver.UpdateRecord(ctx, rec.ID, func(r *runtime.Record) error {
		r.LatestCheckpoint = m.ID
		return nil
	}); err != nil {
		return checkpoint.Manifest{}, s.runtimeError(rec.ID, err, "could not record the checkpoint")
	}
	s.metrics.lifecycle("checkpoint", "ok", s.now().Sub(start))
	s.log.Info("workspace checkpointed", "sandbox", rec.ID, "snapshot", m.ID, "bytes", m.Size, "ms", s.now().Sub(start).Milliseconds())
	s.retain(ctx, rec, m.ID)
	return m, nil
}

// exportWorkspace streams the workspace as tar: from the driver when it can read the
// workspace itself (runtime.WorkspaceExporter), else from the guest init.
func (s *Service) exportWorkspace(ctx context.Context, id string) (io.ReadCloser, error) {
	if ex, ok := s.driver.(runtime.WorkspaceExporter); ok {
		r, err := ex.ExportWorkspace(ctx, id)
		if err != nil {
			return nil, apierror.Wrap(err, apierror.Unavailable, "could not read the workspace for a checkpoint")
		}
		return r, nil
	}
	g, err := s.guest(ctx, id)
	if err != nil {
		return nil, err
	}
	r, err := g.ExportWorkspace(ctx)
	if err != nil {
		return nil, apierror.Wrap(err, apierror.Unavailable, "could not read the workspace for a checkpoint")
	}
	return r, nil
}

// restore extracts checkpoint snapID of scope sc into the workspace of the running sandbox
// id, replacing what is there. The stream is hashed as it is read: a checkpoint whose hash
// does not match aborts the import before anything replaces the workspace.
func (s *Service) restore(ctx context.Context, id string, sc checkpoint.Scope, snapID string) error {
	start := s.now()
	r, _, err := s.ckpt.Open(ctx, sc, snapID)
	switch {
	case errors.Is(err, checkpoint.ErrCorrupt):
		return s.corruptCheckpoint(ctx, sc, snapID, err)
	case errors.Is(err, checkpoint.ErrNotFound):
		return apierror.Wrap(err, apierror.Unavailable, "could not open checkpoint %s: it no longer exists", snapID)
	case err != nil:
		return apierror.Wrap(err, apierror.Unavailable, "could not open checkpoint %s", snapID)
	}
	defer r.Close()
	g, err := s.guest(ctx, id)
	if err != nil {
		return err
	}
	if _, err := g.ImportWorkspace(ctx, r, client.ImportOptions{Replace: true, AllowExternalSymlinks: true}); err != nil {
		if errors.Is(err, checkpoint.ErrCorrupt) {
			return s.corruptCheckpoint(ctx, sc, snapID, err)
		}
		if proto.IsNoSpace(err) {
			return apierror.Wrap(err, apierror.PayloadTooLarge,
				"checkpoint %s does not fit the sandbox's disk: the disk filled up while it was restored", snapID).WithDetail("snapshot_id", snapID)
		}
		return apierror.Wrap(err, apierror.Unavailable, "could not restore checkpoint %s", snapID)
	}
	s.metrics.lifecycle("restore", "ok", s.now().Sub(start))
	s.log.Info("workspace restored", "sandbox", id, "snapshot", snapID, "ms", s.now().Sub(start).Milliseconds())
	return nil
}

// corruptCheckpoint is the error for a checkpoint whose data does not match its manifest: it
// names the newest earlier snapshot of the same sandbox that is intact (each candidate is read
// whole and hashed, newest first), so the caller can create a sandbox from it.
func (s *Service) corruptCheckpoint(ctx context.Context, sc checkpoint.Scope, snapID string, cause error) error {
	s.log.Error("corrupt checkpoint", "sandbox", sc.Sandbox, "snapshot", snapID, "err", cause)
	_, bad, _ := checkpoint.ParseID(snapID)
	good := ""
	if list, err := s.ckpt.List(ctx, sc); err == nil {
		for i := len(list) - 1; i >= 0 && good == ""; i-- {
			if m := list[i]; m.N < bad || bad == 0 && m.ID != snapID {
				if _, err := s.ckpt.Verify(ctx, sc, m.ID); err == nil {
					good = m.ID
				}
			}
		}
	}
	if good == "" {
		return apierror.Wrap(cause, apierror.CheckpointCorrupt,
			"checkpoint %s is corrupt (its data does not match its manifest) and no earlier snapshot of this sandbox is intact", snapID).
			WithDetail("snapshot_id", snapID)
	}
	return apierror.Wrap(cause, apierror.CheckpointCorrupt,
		"checkpoint %s is corrupt (its data does not match its manifest); the last good snapshot is %s: create a sandbox from it with source.snapshot_id", snapID, good).
		WithDetail("snapshot_id", snapID).WithDetail("last_good_snapshot_id", good)
}

// ---- slots and activity ----

// systemKey is the principal key of the control plane's own actions (the reconciler): they act
// as the sandbox's owner but are not activity.
const systemKey = "system:reconciler"

// acquire takes a concurrency slot for sandbox id of tenant:project.
func (s *Service) acquire(ctx context.Context, tenant, project, id string) error {
	if s.quota == nil {
		return nil
	}
	if _, err := s.quota.Acquire(ctx, tenant, project, id); err != nil {
		if apierror.Is(err, apierror.QuotaExceeded) {
			return err
		}
		return apierror.Wrap(err, apierror.Unavailable, "the quota store is unavailable").WithRetryAfter(time.Second)
	}
	return nil
}

// release gives sandbox id's slot back. A failure only delays it: the lease runs out.
func (s *Service) release(ctx context.Context, tenant, project, id string) {
	if s.quota == nil {
		return
	}
	if err := s.quota.Release(context.WithoutCancel(ctx), tenant, project, id); err != nil {
		s.log.Warn("releasing a slot failed; its lease will run out", "sandbox", id, "err", err)
	}
}

// releaseUnlessHolding gives the slot back unless the sandbox is (still, or by another call)
// in a state that holds one.
func (s *Service) releaseUnlessHolding(ctx context.Context, tenant, project, id string) {
	if box, err := s.driver.Get(context.WithoutCancel(ctx), id); err == nil && holdsSlot(State(box.Record.State)) {
		return
	}
	s.release(ctx, tenant, project, id)
}

// holdsSlot reports whether a sandbox in state st holds a concurrency slot.
func holdsSlot(st State) bool { return st == Creating || st == Starting || st == Running }

// Quota reports the caller's concurrency limit and use.
func (s *Service) Quota(ctx context.Context, p auth.Principal) (quota.Usage, error) {
	if s.quota == nil {
		return quota.Usage{}, nil
	}
	u, err := s.quota.Usage(ctx, p.Tenant, p.Project)
	if err != nil {
		return quota.Usage{}, apierror.Wrap(err, apierror.Unavailable, "the quota store is unavailable")
	}
	return u, nil
}

// touch records activity on a sandbox (for auto-stop).
func (s *Service) touch(ctx context.Context, id string) {
	if err := s.store.Touch(context.WithoutCancel(ctx), id, s.now()); err != nil {
		s.log.Debug("recording activity failed", "sandbox", id, "err", err)
	}
}

// lastActivity is the later of the recorded activity and the last state change (which stands
// in when Redis lost the activity).
func lastActivity(recorded time.Time, rec runtime.Record) time.Time {
	if recorded.After(rec.StateChangedAt) {
		return recorded
	}
	return rec.StateChangedAt
}

func (s *Service) withActivity(ctx context.Context, sb Sandbox) Sandbox {
	one := []Sandbox{sb}
	s.withActivities(ctx, one)
	return one[0]
}

// withActivities fills AutostopAt of running sandboxes from their recorded activity.
func (s *Service) withActivities(ctx context.Context, sbs []Sandbox) {
	var ids []string
	for _, sb := range sbs {
		if sb.State == Running {
			ids = append(ids, sb.ID)
		}
	}
	if len(ids) == 0 {
		return
	}
	acts, err := s.store.Activity(ctx, ids...)
	if err != nil {
		s.log.Debug("reading activity failed", "err", err)
	}
	for i := range sbs {
		if sbs[i].State != Running {
			continue
		}
		last := acts[sbs[i].ID]
		if sbs[i].StateChangedAt.After(last) {
			last = sbs[i].StateChangedAt
		}
		sbs[i].AutostopAt = AutostopAt(last, sbs[i].AutostopSec)
	}
}

// ---- exec ----

func (s *Service) validateExec(req ExecRequest) (time.Duration, error) {
	l := s.cfg.Limits
	if len(req.Command) == 0 || req.Command[0] == "" {
		return 0, apierror.New(apierror.InvalidArgument, "command must be a non-empty array whose first element names the program, e.g. [\"bash\",\"-lc\",\"ls\"]").
			WithDetail("field", "command")
	}
	if len(req.Command) > l.ExecMaxArgs {
		return 0, apierror.New(apierror.InvalidArgument, "command has %d arguments, at most %d", len(req.Command), l.ExecMaxArgs)
	}
	n := 0
	for _, a := range req.Command {
		if strings.ContainsRune(a, 0) {
			return 0, apierror.New(apierror.InvalidArgument, "command arguments must not contain NUL bytes")
		}
		n += len(a)
	}
	if n > l.ExecMaxCommandBytes {
		return 0, apierror.New(apierror.PayloadTooLarge, "command is %d bytes, at most %d", n, l.ExecMaxCommandBytes)
	}
	if len(req.Stdin) > l.ExecMaxStdinBytes {
		return 0, apierror.New(apierror.PayloadTooLarge, "stdin is %d bytes, at most %d", len(req.Stdin), l.ExecMaxStdinBytes)
	}
	if len(req.Cwd) > l.MaxPathBytes || strings.ContainsRune(req.Cwd, 0) {
		return 0, apierror.New(apierror.InvalidArgument, "cwd must be a path of at most %d bytes", l.MaxPathBytes)
	}
	if err := s.validateEnv(req.Env); err != nil {
		return 0, err
	}
	t, err := bounded("timeout_sec", req.TimeoutSec, l.ExecTimeoutDefaultSec, 1, l.ExecTimeoutMaxSec)
	if err != nil {
		return 0, err
	}
	return time.Duration(t) * time.Second, nil
}

// guestError turns a failed guest call into a client error: a broken attach to a dead box
// marks the sandbox FAILED; a guest's own error keeps its meaning.
func (s *Service) guestError(ctx context.Context, id string, err error) error {
	var ge *proto.Error
	if errors.As(err, &ge) {
		switch ge.Code {
		case proto.ErrCodeNotFound:
			return apierror.Wrap(err, apierror.NotFound, "%s", ge.Message)
		case proto.ErrCodeInvalid, proto.ErrCodeIsDir, proto.ErrCodeNotDir:
			return apierror.Wrap(err, apierror.InvalidArgument, "%s", ge.Message)
		case proto.ErrCodeTooLarge, proto.ErrCodeNoSpace:
			return apierror.Wrap(err, apierror.PayloadTooLarge, "%s", ge.Message)
		case proto.ErrCodeExists:
			return apierror.Wrap(err, apierror.AlreadyExists, "%s", ge.Message)
		case proto.ErrCodeUnavailable:
			return apierror.Wrap(err, apierror.Unavailable, "%s", ge.Message).WithRetryAfter(time.Second)
		case proto.ErrCodeTooMany:
			return apierror.Wrap(err, apierror.LimitExceeded, "%s", ge.Message).
				WithDetail("limit_name", "running_execs_per_sandbox").WithRetryAfter(time.Second)
		}
		return apierror.Wrap(err, apierror.Internal, "internal error")
	}
	if ctx.Err() != nil {
		return apierror.Wrap(err, apierror.Unavailable, "the request was cancelled")
	}
	s.dropAttach(id)
	box, gerr := s.driver.Get(context.WithoutCancel(ctx), id)
	if gerr == nil && box.Phase == runtime.PhaseFailed {
		rec := s.observe(context.WithoutCancel(ctx), box)
		return apierror.Wrap(err, apierror.SandboxFailed, "the sandbox failed: %s", rec.StateReason).WithDetail("state", rec.State)
	}
	return apierror.Wrap(err, apierror.Unavailable, "lost the connection to the sandbox; retry").WithRetryAfter(time.Second)
}

// ---- files ----

// ReadFile returns a file of the workspace, refusing files larger than maxBytes.
func (s *Service) ReadFile(ctx context.Context, p auth.Principal, id, path string, maxBytes int64) ([]byte, FileInfo, error) {
	r, info, err := s.OpenFile(ctx, p, id, path)
	if err != nil {
		return nil, FileInfo{}, err
	}
	defer r.Close()
	if maxBytes <= 0 || maxBytes > s.cfg.Limits.MaxFileBytes {
		maxBytes = s.cfg.Limits.MaxFileBytes
	}
	if info.Size > maxBytes {
		return nil, FileInfo{}, apierror.New(apierror.PayloadTooLarge, "%s is %d bytes, at most %d can be read here", path, info.Size, maxBytes)
	}
	data, err := io.ReadAll(io.LimitReader(r, maxBytes+1))
	if err != nil {
		return nil, FileInfo{}, s.guestError(ctx, id, err)
	}
	if int64(len(data)) > maxBytes {
		return nil, FileInfo{}, apierror.New(apierror.PayloadTooLarge, "%s grew beyond %d bytes while being read", path, maxBytes)
	}
	return data, info, nil
}

// OpenFile streams a file of the workspace. The caller closes the reader.
func (s *Service) OpenFile(ctx context.Context, p auth.Principal, id, path string) (io.ReadCloser, FileInfo, error) {
	if err := s.validatePath(path); err != nil {
		return nil, FileInfo{}, err
	}
	g, err := s.filesGuest(ctx, p, id)
	if err != nil {
		return nil, FileInfo{}, err
	}
	r, fi, err := g.ReadFile(ctx, path)
	if err != nil {
		return nil, FileInfo{}, s.guestError(ctx, id, err)
	}
	if fi.Size > s.cfg.Limits.MaxFileBytes {
		r.Close()
		return nil, FileInfo{}, apierror.New(apierror.PayloadTooLarge, "%s is %d bytes, at most %d", path, fi.Size, s.cfg.Limits.MaxFileBytes)
	}
	return r, fileInfo(fi), nil
}

// WriteFile writes a file into the workspace (parents created), bounded by the file limit.
func (s *Service) WriteFile(ctx context.Context, p auth.Principal, id, path string, mode os.FileMode, r io.Reader) (FileInfo, error) {
	if err := s.validatePath(path); err != nil {
		return FileInfo{}, err
	}
	if mode == 0 {
		mode = 0o644
	}
	if mode&^os.ModePerm != 0 {
		return FileInfo{}, apierror.New(apierror.InvalidArgument, "mode must be permission bits only (e.g. 0644), got %o", mode)
	}
	g, err := s.filesGuest(ctx, p, id)
	if err != nil {
		return FileInfo{}, err
	}
	lr := &limitedReader{r: r, left: s.cfg.Limits.MaxFileBytes}
	fi, err := g.WriteFile(ctx, path, mode, lr)
	if lr.over {
		return FileInfo{}, apierror.New(apierror.PayloadTooLarge, "the file is larger than %d bytes", s.cfg.Limits.MaxFileBytes)
	}
	if err != nil {
		return FileInfo{}, s.guestError(ctx, id, err)
	}
	return fileInfo(fi), nil
}

// ListDir lists a folder of the workspace.
func (s *Service) ListDir(ctx context.Context, p auth.Principal, id, path string, limit int) ([]FileInfo, bool, error) {
	if path == "" {
		path = "."
	}
	if err := s.validatePath(path); err != nil {
		return nil, false, err
	}
	if limit <= 0 {
		limit = 1000
	}
	if limit > s.cfg.Limits.MaxListEntries {
		return nil, false, apierror.New(apierror.InvalidArgument, "limit must be at most %d, got %d", s.cfg.Limits.MaxListEntries, limit)
	}
	g, err := s.filesGuest(ctx, p, id)
	if err != nil {
		return nil, false, err
	}
	entries, truncated, err := g.ListDir(ctx, path, limit)
	if err != nil {
		return nil, false, s.guestError(ctx, id, err)
	}
	out := make([]FileInfo, len(entries))
	for i, e := range entries {
		out[i] = fileInfo(e)
	}
	return out, truncated, nil
}

func (s *Service) filesGuest(ctx context.Context, p auth.Principal, id string) (*client.Client, error) {
	if _, err := s.load(ctx, p, id, VerbFiles); err != nil {
		return nil, err
	}
	return s.guest(ctx, id)
}

func (s *Service) validatePath(path string) error {
	if path == "" {
		return apierror.New(apierror.InvalidArgument, "path is required").WithDetail("field", "path")
	}
	if len(path) > s.cfg.Limits.MaxPathBytes || strings.ContainsRune(path, 0) {
		return apierror.New(apierror.InvalidArgument, "path must be at most %d bytes without NUL", s.cfg.Limits.MaxPathBytes)
	}
	return nil
}

type limitedReader struct {
	r    io.Reader
	left int64
	over bool
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.left < 0 {
		l.over = true
		return 0, errors.New("file too large")
	}
	if int64(len(p)) > l.left+1 {
		p = p[:l.left+1]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	if l.left < 0 {
		l.over = true
		return 0, errors.New("file too large")
	}
	return n, err
}

// ---- events ----

// Events follows status events of one of the caller's sandboxes, or of the caller's whole
// project when sandboxID is "". after resumes after a cursor ("" = only new events).
func (s *Service) Events(ctx context.Context, p auth.Principal, sandboxID, after string) (<-chan Event, error) {
	if sandboxID != "" {
		if _, err := s.load(ctx, p, sandboxID, VerbGet); err != nil {
			return nil, err
		}
	}
	if !events.ValidCursor(after) {
		return nil, apierror.New(apierror.InvalidArgument, "malformed cursor %q", truncate(after, 64))
	}
	release, err := s.holdStream(p)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	in, err := s.events.Subscribe(sctx, p.Tenant, p.Project, sandboxID, after)
	if err != nil {
		cancel()
		release()
		if errors.Is(err, events.ErrTooManySubscribers) {
			return nil, apierror.Wrap(err, apierror.Unavailable, "this server follows as many subscriptions as it may; retry shortly").
				WithRetryAfter(5 * time.Second)
		}
		return nil, apierror.Wrap(err, apierror.Unavailable, "the event stream is unavailable")
	}
	out := make(chan Event)
	go func() {
		defer release()
		defer close(out)
		defer cancel() // ends the Redis reader too when we stop early
		for ev := range in {
			e := Event{Cursor: ev.Cursor, Type: ev.Type, SandboxID: ev.SandboxID, State: State(ev.Fields["state"]),
				PreviousState: State(ev.Fields["previous_state"]), Reason: ev.Fields["reason"], At: ev.At}
			switch ev.Type {
			case EventExecStarted, EventExecEnded:
				e.Exec = execEventResult(ev)
			case EventBootstrapProgress:
				e.BytesRead, _ = strconv.ParseInt(ev.Fields["bytes_read"], 10, 64)
			}
			select {
			case out <- e:
			case <-ctx.Done():
				return
			}
			if sandboxID != "" && e.State == Destroyed {
				// Nothing more will happen to this sandbox: end the subscription.
				return
			}
		}
	}()
	return out, nil
}

// ---- attach cache ----

// attachment is this replica's attach stream to one sandbox's guest init, shared by every call.
type attachment struct {
	ready  chan struct{}
	client *client.Client
	err    error
}

func (a *attachment) close() {
	<-a.ready
	if a.client != nil {
		a.client.Close()
	}
}

// guest returns a client on the sandbox's guest init, attaching once per sandbox and replica.
func (s *Service) guest(ctx context.Context, id string) (*client.Client, error) {
	for {
		s.mu.Lock()
		a, ok := s.attachs[id]
		if !ok {
			a = &attachment{ready: make(chan struct{})}
			s.attachs[id] = a
			s.mu.Unlock()
			a.client, a.err = s.attach(ctx, id)
			close(a.ready)
			if a.err != nil {
				s.mu.Lock()
				if s.attachs[id] == a {
					delete(s.attachs, id)
				}
				s.mu.Unlock()
				return nil, a.err
			}
			return a.client, nil
		}
		s.mu.Unlock()
		select {
		case <-a.ready:
		case <-ctx.Done():
			return nil, apierror.Wrap(ctx.Err(), apierror.Unavailable, "the request was cancelled")
		}
		if a.err != nil {
			return nil, a.err
		}
		select {
		case <-a.client.Done():
			// The stream broke: forget it and attach again.
			s.mu.Lock()
			if s.attachs[id] == a {
				delete(s.attachs, id)
			}
			s.mu.Unlock()
			continue
		default:
			return a.client, nil
		}
	}
}

func (s *Service) attach(ctx context.Context, id string) (*client.Client, error) {
	// The attach outlives the request that opened it.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	rwc, err := s.driver.Attach(actx, id)
	if err != nil {
		if errors.Is(err, runtime.ErrNotRunning) {
			box, gerr := s.driver.Get(actx, id)
			if gerr == nil && box.Phase == runtime.PhaseFailed {
				rec := s.observe(actx, box)
				return nil, apierror.Wrap(err, apierror.SandboxFailed, "the sandbox failed: %s", rec.StateReason)
			}
		}
		return nil, apierror.Wrap(err, apierror.Unavailable, "could not attach to the sandbox").WithRetryAfter(time.Second)
	}
	c, err := client.Dial(rwc)
	if err != nil {
		rwc.Close()
		return nil, apierror.Wrap(err, apierror.Unavailable, "the sandbox's init does not answer").WithRetryAfter(time.Second)
	}
	return c, nil
}

func (s *Service) dropAttach(id string) {
	s.mu.Lock()
	a, ok := s.attachs[id]
	delete(s.attachs, id)
	s.mu.Unlock()
	if ok {
		go a.close()
	}
}

// ---- conversions ----

func entryOf(rec runtime.Record) store.Entry {
	return store.Entry{ID: rec.ID, Tenant: rec.Tenant, Project: rec.Project, State: rec.State,
		Profile: rec.Spec.Profile, CreatedAt: rec.CreatedAt}
}

// EntryOf converts a runtime box to its lookup entry (the store's rebuild source).
func EntryOf(b runtime.Box) store.Entry { return entryOf(b.Record) }

func scopeOf(rec runtime.Record) checkpoint.Scope {
	return checkpoint.Scope{Tenant: rec.Tenant, Project: rec.Project, Sandbox: rec.ID}
}

func toSandbox(rec runtime.Record) Sandbox {
	return Sandbox{ID: rec.ID, Tenant: rec.Tenant, Project: rec.Project, Profile: rec.Spec.Profile,
		State: State(rec.State), StateReason: rec.StateReason, CreatedAt: rec.CreatedAt, StateChangedAt: rec.StateChangedAt,
		AutostopSec: rec.AutostopSec, TTLSec: rec.TTLSec, LatestSnapshotID: rec.LatestCheckpoint,
		MilliCPU: rec.Spec.MilliCPU, MemoryBytes: rec.Spec.MemoryBytes, DiskBytes: rec.Spec.DiskBytes, Network: network(rec.Spec.Network)}
}

func fileInfo(f proto.FileInfo) FileInfo {
	return FileInfo{Name: f.Name, Path: f.Path, Size: f.Size, Mode: f.Mode, IsDir: f.IsDir, Symlink: f.Symlink, ModTime: f.ModTime}
}
