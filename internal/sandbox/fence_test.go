package sandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"sandboxd/internal/apierror"
	"sandboxd/internal/domain"
	"sandboxd/internal/domain/domaintest"
	. "sandboxd/internal/sandbox"
	"sandboxd/internal/store"
	"sandboxd/runtime"
)

// TestStaleLockHolderIsFencedOff: replica A stops a sandbox and is held up (its Redis calls
// fail, as in a long pause: no renewal) just before its driver.Stop, long enough for its
// operation lock to lapse. Replica B's reconciler takes the lock, finishes the stop, and B
// starts the sandbox again. When A goes on, its driver.Stop carries its old fence: the runtime
// refuses it, A answers INVALID_STATE saying another replica took over, and the sandbox B
// started is as B left it (running, its record, its slot).
func TestStaleLockHolderIsFencedOff(t *testing.T) {
	const ttl = 600 * time.Millisecond
	e := domaintest.New(t, domaintest.Options{RealRedis: true, Config: func(c *Config) { c.LockTTL = ttl }})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}

	// Replica A: its own Redis client (which the test can pause) and a driver that holds its
	// Stop until the test lets it go.
	paused := &pauseHook{}
	rdb := redis.NewClient(&redis.Options{Addr: e.Redis.Addr})
	t.Cleanup(func() { rdb.Close() })
	rdb.AddHook(paused)
	gate := &stopGate{Driver: e.Fake, reached: make(chan struct{}), release: make(chan struct{})}
	deps := e.NewDeps()
	deps.Driver = gate
	deps.Store = store.New(rdb, func(ctx context.Context) ([]store.Entry, error) {
		boxes, err := e.Fake.List(ctx)
		var out []store.Entry
		for _, b := range boxes {
			out = append(out, EntryOf(b))
		}
		return out, err
	})
	a, err := domain.New(e.Config, deps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)

	stopped := make(chan error, 1)
	go func() {
		_, err := a.Stop(ctx, alice, sb.ID)
		stopped <- err
	}()
	select {
	case <-gate.reached:
	case err := <-stopped:
		t.Fatalf("A's stop ended before its driver.Stop: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("A's stop never reached driver.Stop")
	}
	boxA, _ := e.Fake.Get(ctx, sb.ID)
	if boxA.Record.State != string(Stopping) || boxA.Fence == 0 {
		t.Fatalf("while A stops: got %s with fence %d, want STOPPING with A's fence", boxA.Record.State, boxA.Fence)
	}
	// A is held up: no renewal reaches Redis, and its lease runs out.
	paused.on.Store(true)
	time.Sleep(ttl + ttl/2)

	// B's reconciler finds the STOPPING sandbox without a live lock and finishes the stop;
	// then B starts it again.
	e.Clock.Advance(time.Minute)
	if err := e.Svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := e.Svc.Get(ctx, alice, sb.ID); err != nil || got.State != Stopped {
		t.Fatalf("after B's reconciler: got %s, %v, want STOPPED", got.State, err)
	}
	if _, err := e.Svc.Start(ctx, alice, sb.ID); err != nil {
		t.Fatalf("B's start: %v", err)
	}
	before, err := e.Fake.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if before.Phase != runtime.PhaseRunning || before.Record.State != string(Running) || before.Fence <= boxA.Fence {
		t.Fatalf("after B: got %s/%s with fence %d, want RUNNING with a fence above A's %d",
			before.Record.State, before.Phase, before.Fence, boxA.Fence)
	}

	// A goes on, with its lapsed lock's fence.
	paused.on.Store(false)
	close(gate.release)
	select {
	case err = <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("A's stop did not end")
	}
	ae := apierror.From(err)
	if ae.Code != apierror.InvalidState || ae.RetryAfter <= 0 || !strings.Contains(ae.Message, "another replica took over") ||
		!errors.Is(err, runtime.ErrFenced) {
		t.Fatalf("A's stop: got %v (code %s, retry after %v), want INVALID_STATE with Retry-After saying another replica took over",
			err, ae.Code, ae.RetryAfter)
	}
	after, err := e.Fake.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := jsonString(t, after), jsonString(t, before); got != want {
		t.Fatalf("A's fenced-off stop changed the box: got %s, want %s", got, want)
	}
	if res := e.MustExec(t, alice, sb.ID, "echo", "alive"); string(res.Stdout) != "alive\n" {
		t.Fatalf("exec after A's stop: got %q, want the sandbox running", res.Stdout)
	}
	if u := e.Usage(t); u.InUse != 1 {
		t.Fatalf("got %d slots in use, want 1 (A gave back nothing)", u.InUse)
	}
}

// stopGate is a driver whose Stop waits, once, until the test releases it.
type stopGate struct {
	runtime.Driver
	once    atomic.Bool
	reached chan struct{}
	release chan struct{}
}

func (g *stopGate) Stop(ctx context.Context, id string) error {
	if !g.once.Swap(true) {
		close(g.reached)
		<-g.release
	}
	return g.Driver.Stop(ctx, id)
}

// pauseHook fails every command of a Redis client while on: the replica is held up.
type pauseHook struct{ on atomic.Bool }

var errPaused = errors.New("test: replica paused")

func (h *pauseHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *pauseHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.on.Load() {
			cmd.SetErr(errPaused)
			return errPaused
		}
		return next(ctx, cmd)
	}
}

func (h *pauseHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.on.Load() {
			return errPaused
		}
		return next(ctx, cmds)
	}
}

func jsonString(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
