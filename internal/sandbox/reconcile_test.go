package sandbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/domain/domaintest"
	. "sandboxd/internal/sandbox"
	"sandboxd/runtime"
)

func TestQuotaSlotsTakenAndGivenBack(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{Limit: 3})
	ctx := context.Background()
	var ids []string
	for i := 0; i < 3; i++ {
		sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	_, err := e.Svc.Create(ctx, alice, CreateRequest{})
	ae := apierror.From(err)
	if ae.Code != apierror.QuotaExceeded || ae.RetryAfter <= 0 || ae.Details["limit"] != 3 {
		t.Fatalf("fourth create: got %v (details %v), want QUOTA_EXCEEDED with limit 3 and a retry-after", err, ae.Details)
	}
	// Another project is not affected.
	other, err := e.Svc.Create(ctx, bob, CreateRequest{})
	if err != nil {
		t.Fatalf("another project's create: %v", err)
	}
	if u := e.Usage(t); u.InUse != 3 || u.Limit != 3 {
		t.Fatalf("usage: got %+v, want 3 of 3", u)
	}
	// Stop gives a slot back; start takes it again (and fails when full).
	if _, err := e.Svc.Stop(ctx, alice, ids[0]); err != nil {
		t.Fatal(err)
	}
	if u := e.Usage(t); u.InUse != 2 {
		t.Fatalf("after stop: got %d in use, want 2", u.InUse)
	}
	newer, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatalf("create after a stop: %v", err)
	}
	if _, err := e.Svc.Start(ctx, alice, ids[0]); apierror.CodeOf(err) != apierror.QuotaExceeded {
		t.Fatalf("start on a full project: got %v, want QUOTA_EXCEEDED", err)
	}
	if got, _ := e.Svc.Get(ctx, alice, ids[0]); got.State != Stopped {
		t.Fatalf("a start refused for quota: got %s, want STOPPED", got.State)
	}
	// Destroy and failure give slots back.
	if _, err := e.Svc.Destroy(ctx, alice, newer.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.Fake.Kill(ids[1], "crashed"); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.Svc.Get(ctx, alice, ids[1]); got.State != Failed {
		t.Fatalf("got %s, want FAILED", got.State)
	}
	if u := e.Usage(t); u.InUse != 1 {
		t.Fatalf("after destroy and failure: got %d in use, want 1", u.InUse)
	}
	if _, err := e.Svc.Start(ctx, alice, ids[0]); err != nil {
		t.Fatalf("start with free slots: %v", err)
	}
	if u := e.Usage(t); u.InUse != 2 {
		t.Fatalf("after start: got %d in use, want 2", u.InUse)
	}
	_ = other
}

func TestReconcilerAutostopsIdleButNotBusy(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{AutostopSec: domaintest.Ptr[int64](60)})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := e.Svc.Get(ctx, alice, sb.ID)
	if got.AutostopAt.IsZero() {
		t.Fatal("a running sandbox shows no autostop_at")
	}
	// A long command is running: idle time passes, the sandbox stays up.
	done := make(chan error, 1)
	go func() {
		_, err := e.Svc.Exec(ctx, alice, sb.ID, ExecRequest{Command: []string{"sleep", "2"}, TimeoutSec: domaintest.Ptr[int64](30)})
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	e.Clock.Advance(2 * time.Minute)
	if err := e.Svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.Svc.Get(ctx, alice, sb.ID); got.State != Running {
		t.Fatalf("with an exec running: got %s, want RUNNING", got.State)
	}
	if err := <-done; err != nil {
		t.Fatalf("the long exec: %v", err)
	}
	// Idle for longer than autostop_sec after it: stopped, with the reason, the slot given back.
	e.Clock.Advance(2 * time.Minute)
	if err := e.Svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ = e.Svc.Get(ctx, alice, sb.ID)
	if got.State != Stopped || !strings.Contains(got.StateReason, "auto-stopped") || got.LatestSnapshotID == "" {
		t.Fatalf("idle: got %s %q snapshot %q, want STOPPED, auto-stopped, checkpointed", got.State, got.StateReason, got.LatestSnapshotID)
	}
	if u := e.Usage(t); u.InUse != 0 {
		t.Fatalf("after auto-stop: got %d in use, want 0", u.InUse)
	}
}

// TestReconcilerBusyOfAStuckSandbox: asking a sandbox whose guest stopped answering (its PID 1
// stopped) whether a command runs takes no longer than its bound, and counts it idle (so that
// auto-stop releases it): the reconciler's pass, which renews every project's slot leases,
// is not held by it.
func TestReconcilerBusyOfAStuckSandbox(t *testing.T) {
	const bound = 300 * time.Millisecond
	SetBusyTimeout(t, bound)
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := e.Svc.Exec(ctx, alice, sb.ID, ExecRequest{Command: []string{"sleep", "2"}, TimeoutSec: domaintest.Ptr[int64](30)})
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	if !Busy(e.Svc.Core, ctx, sb.ID) {
		t.Fatal("with an exec running: not busy")
	}
	e.Fake.Stick(sb.ID)
	start := time.Now()
	busy := Busy(e.Svc.Core, ctx, sb.ID)
	took := time.Since(start)
	e.Fake.Unstick(sb.ID)
	if busy || took < bound || took > bound+5*time.Second {
		t.Fatalf("a stuck guest: got busy %v after %v, want idle after the %v bound", busy, took, bound)
	}
	if err := <-done; err != nil {
		t.Fatalf("the exec across the stick: %v", err)
	}
}

func TestReconcilerExpires(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{TTLSec: domaintest.Ptr[int64](60)})
	if err != nil {
		t.Fatal(err)
	}
	e.MustExec(t, alice, sb.ID, "sh", "-c", "echo last > words")
	evs, err := domaintest.Events(ctx, e.Svc, alice, sb.ID, "0-0")
	if err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(61 * time.Second)
	if err := e.Svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Svc.Get(ctx, alice, sb.ID); apierror.CodeOf(err) != apierror.NotFound {
		t.Fatalf("after its ttl: got %v, want NOT_FOUND", err)
	}
	var last Event
	for ev := range evs {
		last = ev
		if ev.State == Destroyed || ev.State == Expired {
			break
		}
	}
	if last.State != Expired || !strings.Contains(last.Reason, "ttl") {
		t.Fatalf("last event: got %s %q, want EXPIRED with the ttl reason", last.State, last.Reason)
	}
	if u := e.Usage(t); u.InUse != 0 {
		t.Fatalf("after expiry: got %d in use, want 0", u.InUse)
	}
}

func TestReconcilerFinishesAnInterruptedStop(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// A replica died after writing STOPPING (it held the lock, which then lapsed).
	if _, err := e.Fake.UpdateRecord(ctx, sb.ID, func(r *runtime.Record) error {
		r.State = string(Stopping)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(time.Minute)
	if err := e.Svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ := e.Svc.Get(ctx, alice, sb.ID)
	if got.State != Stopped || got.LatestSnapshotID == "" {
		t.Fatalf("got %s snapshot %q, want STOPPED with a checkpoint", got.State, got.LatestSnapshotID)
	}
	if box, _ := e.Fake.Get(ctx, sb.ID); box.Phase != runtime.PhaseStopped {
		t.Fatalf("box phase: got %s, want stopped", box.Phase)
	}
	if u := e.Usage(t); u.InUse != 0 {
		t.Fatalf("got %d in use, want 0", u.InUse)
	}
}

func TestReconcilerLeavesAHeldTransitionAlone(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	lock, err := e.Store.Lock(ctx, sb.ID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Unlock(ctx)
	if _, err := e.Fake.UpdateRecord(ctx, sb.ID, func(r *runtime.Record) error {
		r.State = string(Stopping)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(time.Minute)
	if err := e.Svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if box, _ := e.Fake.Get(ctx, sb.ID); box.Record.State != string(Stopping) || box.Phase != runtime.PhaseRunning {
		t.Fatalf("got %s/%s, want the in-flight STOPPING left alone", box.Record.State, box.Phase)
	}
}

func TestReconcilerRenewsAndRebuildsSlots(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if _, err := e.Svc.Create(ctx, alice, CreateRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Redis.Client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if u := e.Usage(t); u.InUse != 2 {
		t.Fatalf("after FLUSHALL: got %d in use, want 2 (rebuilt from the runtime)", u.InUse)
	}
	// Leases outlive their period only through the reconciler's renewals.
	e.Clock.Advance(50 * time.Second)
	if err := e.Svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(50 * time.Second)
	if u := e.Usage(t); u.InUse != 2 {
		t.Fatalf("after renewal and 100 s: got %d in use, want 2", u.InUse)
	}
}

// After a loss of Redis (FLUSHALL), the idle clock restarts from the lookup's rebuild, not from
// the sandbox's last state change: a sandbox used after its create is not stopped early.
func TestReconcilerIdleClockRestartsAfterFlushAll(t *testing.T) {
	for _, real := range []bool{false, true} {
		t.Run(map[bool]string{false: "embedded", true: "redis-server"}[real], func(t *testing.T) {
			e := domaintest.New(t, domaintest.Options{RealRedis: real})
			ctx := context.Background()
			sb, err := e.Svc.Create(ctx, alice, CreateRequest{AutostopSec: domaintest.Ptr[int64](60)})
			if err != nil {
				t.Fatal(err)
			}
			// Used 50 s after its create (its last state change), then Redis loses everything.
			e.Clock.Advance(50 * time.Second)
			if _, err := e.Svc.Get(ctx, alice, sb.ID); err != nil {
				t.Fatal(err)
			}
			if err := e.Redis.Client.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			// 70 s after the create, 20 s after the flush: the state change is older than
			// autostop_sec, but the clock restarted at the rebuild this pass makes.
			e.Clock.Advance(20 * time.Second)
			if err := e.Svc.Reconcile(ctx); err != nil {
				t.Fatal(err)
			}
			got, err := e.Svc.Get(ctx, alice, sb.ID)
			if err != nil || got.State != Running {
				t.Fatalf("20 s after the flush: got %s, %v; want RUNNING (the idle clock restarts at the rebuild)", got.State, err)
			}
			// Get touched it just now. FLUSHALL again, and let the next pass rebuild at once (as
			// the reconciler does within its interval): only the rebuild's time holds it up.
			if err := e.Redis.Client.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			rebuilt := e.Clock.Now()
			if err := e.Svc.Reconcile(ctx); err != nil {
				t.Fatal(err)
			}
			e.Clock.Advance(59 * time.Second)
			if err := e.Svc.Reconcile(ctx); err != nil {
				t.Fatal(err)
			}
			if box, _ := e.Fake.Get(ctx, sb.ID); box.Record.State != string(Running) {
				t.Fatalf("59 s after the second flush: got %s, want RUNNING", box.Record.State)
			}
			acts, err := e.Store.Activity(ctx, sb.ID)
			if err != nil || acts[sb.ID].Before(rebuilt.Truncate(time.Millisecond)) {
				t.Fatalf("activity after the rebuild: got %v, %v; want at or after the rebuild at %v", acts[sb.ID], err, rebuilt)
			}
			// Past autostop_sec after the rebuild: stopped.
			e.Clock.Advance(2 * time.Second)
			if err := e.Svc.Reconcile(ctx); err != nil {
				t.Fatal(err)
			}
			if box, _ := e.Fake.Get(ctx, sb.ID); box.Record.State != string(Stopped) {
				t.Fatalf("61 s after the rebuild: got %s, want STOPPED", box.Record.State)
			}
		})
	}
}

// When Redis cannot say when a sandbox was last used, the reconciler does not auto-stop it.
func TestReconcilerNoAutostopWithoutRedis(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{AutostopSec: domaintest.Ptr[int64](60)})
	if err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(10 * time.Minute)
	e.Redis.Stop()
	_ = e.Svc.Reconcile(ctx)
	if box, _ := e.Fake.Get(ctx, sb.ID); box.Record.State != string(Running) {
		t.Fatalf("with Redis down: got %s, want RUNNING", box.Record.State)
	}
}
