// Package domaintest runs the domain for tests: real services over the fake runtime (a real
// guest server on the host), Redis (embedded, or a real redis-server) and a local checkpoint
// folder, as many replicas as a test asks for. It is what the tests of internal/sandbox,
// internal/execs and internal/agents drive.
package domaintest

import (
	"context"
	"sync"
	"testing"
	"time"

	"sandboxd/internal/agentrun"
	"sandboxd/internal/auth"
	"sandboxd/internal/checkpoint"
	"sandboxd/internal/domain"
	"sandboxd/internal/events"
	"sandboxd/internal/execstream"
	"sandboxd/internal/quota"
	"sandboxd/internal/redistest"
	"sandboxd/internal/sandbox"
	"sandboxd/internal/store"
	"sandboxd/runtime/runtimetest"
)

// Two callers of different tenants.
var (
	Alice = auth.Principal{Key: "a", Tenant: "t1", Project: "p1"}
	Bob   = auth.Principal{Key: "b", Tenant: "t2", Project: "p1"}
)

// Env is a running domain: its first replica (Svc) and what it runs on.
type Env struct {
	Svc   *domain.Service
	Fake  *runtimetest.Fake
	Ckpt  *checkpoint.Store
	Objs  *checkpoint.LocalStore
	Redis *redistest.Server
	Clock *Clock
	// Store is the lookup every replica shares.
	Store *store.Store

	// Config is every replica's config; NewDeps makes a replica's deps (a test may wrap it).
	Config  sandbox.Config
	NewDeps func() domain.Deps
}

// Clock is the services' clock in tests: real time plus an offset the test advances.
type Clock struct {
	mu     sync.Mutex
	offset time.Duration
}

// Now is the time on the clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}

// Options adjust New's domain.
type Options struct {
	// Limit is the concurrency limit per project (0: unlimited).
	Limit int
	// Config adjusts the config; Deps adjusts the deps of every replica.
	Config func(*sandbox.Config)
	Deps   func(*domain.Deps)
	// RealRedis runs a redis-server instead of the embedded Redis.
	RealRedis bool
}

// New wires the real services over the fake driver, Redis and a local checkpoint folder, and
// starts the first replica. Everything stops when the test ends.
func New(t *testing.T, opts Options) *Env {
	t.Helper()
	fake := runtimetest.NewFakeT(t)
	rs := redistest.Embedded(t)
	if opts.RealRedis {
		rs = redistest.Start(t)
	}
	objs, err := checkpoint.NewLocalStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ck := checkpoint.New(objs, checkpoint.Options{})
	clock := &Clock{}
	st := store.New(rs.Client, func(ctx context.Context) ([]store.Entry, error) {
		boxes, err := fake.List(ctx)
		if err != nil {
			return nil, err
		}
		var out []store.Entry
		for _, b := range boxes {
			out = append(out, sandbox.EntryOf(b))
		}
		return out, nil
	}).WithClock(clock.Now)
	cfg := sandbox.Config{Profiles: []sandbox.ProfileConfig{{Name: "p", MemoryMB: 64}}, Limits: sandbox.DefaultLimits(),
		LockTTL: 3 * time.Second}
	q := quota.New(rs.Client, sandbox.SlotSource(fake), quota.Options{Limits: quota.Limits{Default: opts.Limit}, Lease: time.Minute,
		Settle: -1, Now: clock.Now})
	e := &Env{Fake: fake, Ckpt: ck, Objs: objs, Redis: rs, Clock: clock, Store: st}
	e.NewDeps = func() domain.Deps {
		d := domain.Deps{Driver: fake, Store: st, Events: events.New(rs.Client, events.Options{MaxLen: 100}), Checkpoints: ck,
			Execs: execstream.New(rs.Client, execstream.Options{Now: clock.Now, Block: 200 * time.Millisecond}), Quota: q, Now: clock.Now,
			AgentRuns: agentrun.New(rs.Client, agentrun.Options{})}
		if opts.Deps != nil {
			opts.Deps(&d)
		}
		return d
	}
	if opts.Config != nil {
		opts.Config(&cfg)
	}
	e.Config = cfg
	e.Svc = e.Replica(t)
	return e
}

// Replica starts another replica on the same runtime and Redis; it closes when the test ends.
func (e *Env) Replica(t *testing.T) *domain.Service {
	t.Helper()
	svc, err := domain.New(e.Config, e.NewDeps())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	return svc
}

// Ptr returns a pointer to v (the optional fields of requests).
func Ptr[T any](v T) *T { return &v }

// CreateRunning creates a sandbox of the default profile for p.
func (e *Env) CreateRunning(t *testing.T, p auth.Principal) sandbox.Sandbox {
	t.Helper()
	sb, err := e.Svc.Create(context.Background(), p, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// MustExec runs argv in sandbox id and waits for its end.
func (e *Env) MustExec(t *testing.T, p auth.Principal, id string, argv ...string) sandbox.ExecResult {
	t.Helper()
	res, err := e.Svc.Exec(context.Background(), p, id, sandbox.ExecRequest{Command: argv, TimeoutSec: Ptr[int64](30)})
	if err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	return res
}

// Usage is Alice's quota use.
func (e *Env) Usage(t *testing.T) quota.Usage {
	t.Helper()
	u, err := e.Svc.Quota(context.Background(), Alice)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// Collect reads an exec's output events to the end (or a minute's deadline).
func Collect(t *testing.T, ch <-chan sandbox.ExecEvent) (stdout, stderr []byte, evs []sandbox.ExecEvent) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return stdout, stderr, evs
			}
			evs = append(evs, ev)
			if ev.Kind == sandbox.ExecChunk {
				if ev.Stream == "stderr" {
					stderr = append(stderr, ev.Data...)
				} else {
					stdout = append(stdout, ev.Data...)
				}
			}
		case <-deadline:
			t.Fatalf("the exec's output did not end; %d events so far", len(evs))
		}
	}
}

// Events is svc's EventsFunc as a channel, closed when the stream ends (see EventsFunc): how
// the tests read a stream of status events.
func Events(ctx context.Context, svc *domain.Service, p auth.Principal, sandboxID, after string) (<-chan sandbox.Event, error) {
	out := make(chan sandbox.Event)
	send := func(e sandbox.Event) bool {
		select {
		case out <- e:
			return true
		case <-ctx.Done():
			return false
		}
	}
	if err := svc.EventsFunc(ctx, p, sandboxID, after, send, func() { close(out) }); err != nil {
		return nil, err
	}
	return out, nil
}
