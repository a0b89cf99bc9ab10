package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"sandboxd/internal/quota"
	"sandboxd/internal/redistest"
	"sandboxd/runtime"
	"sandboxd/runtime/runtimetest"
)

// TestKeepRenewing: while a reconcile pass runs, its holders' leases are extended every
// quarter lease, so that a pass held up by one sandbox (a stuck guest, a large checkpoint)
// lets no project's slots lapse; a slot the pass gave back is not taken again; after stop
// nothing renews.
func TestKeepRenewing(t *testing.T) {
	rs := redistest.Embedded(t)
	const lease = 400 * time.Millisecond
	none := func(context.Context, string, string) ([]string, error) { return nil, nil }
	q := quota.New(rs.Client, none, quota.Options{Limits: quota.Limits{Default: 3}, Lease: lease, Settle: -1})
	s := slots{quota: q, log: slog.Default()}
	ctx := context.Background()
	for _, id := range []string{"a", "b", "c"} {
		if _, err := q.Acquire(ctx, "t", "p", id); err != nil {
			t.Fatal(err)
		}
	}
	inUse := func() int {
		u, err := q.Usage(ctx, "t", "p")
		if err != nil {
			t.Fatal(err)
		}
		return u.InUse
	}
	stop := s.keepRenewing(ctx, map[[2]string][]string{{"t", "p"}: {"a", "b", "c"}})
	if err := q.Release(ctx, "t", "p", "c"); err != nil { // the pass stopped c
		t.Fatal(err)
	}
	time.Sleep(3 * lease)
	if n := inUse(); n != 2 {
		t.Fatalf("three leases into a pass: got %d slots in use, want 2 (a and b renewed, c not taken again)", n)
	}
	stop()
	stop() // a pass stops it twice: on its way out, and deferred
	time.Sleep(2 * lease)
	if n := inUse(); n != 0 {
		t.Fatalf("two leases after the pass stopped renewing: got %d slots in use, want 0", n)
	}
}

// TestRenewTakesNoSlotForALeaver: a pass's holders are what it saw, and another replica may
// have moved one since (a CREATING sandbox whose lock it held, then marked FAILED with its slot
// given back). The pass's renewal takes a slot again only for a holder the runtime still says
// holds one: a RUNNING sandbox whose lease a Redis flush lost gets its slot back; a FAILED
// one, a PAUSING one (a pause gives its slot back before it records PAUSED), and one the
// runtime no longer has, are left without. Seen in the suite: a replica
// killed during a create left its project's one slot held by a FAILED sandbox for a lease.
func TestRenewTakesNoSlotForALeaver(t *testing.T) {
	q, fake, s := renewFixture(t)
	ctx := context.Background()
	box := func(st State) runtime.Record { return boxIn(t, fake, st) }
	running, failed, pausing := box(Running), box(Failed), box(Pausing)
	gone := runtimetest.NewID()
	// The pass saw all four holding a slot; none has one now (a flush; the others' replicas
	// released theirs: after their state changes, or, a pause, once its compute was gone and
	// before it records PAUSED).
	s.renew(ctx, map[[2]string][]string{{"t", "p"}: {running.ID, failed.ID, pausing.ID, gone}})
	for id, want := range map[string]bool{running.ID: true, failed.ID: false, pausing.ID: false, gone: false} {
		held, err := q.Held(ctx, "t", "p", id)
		if err != nil {
			t.Fatal(err)
		}
		if held != want {
			t.Errorf("after the renewal: %s holds a slot: %v, want %v", id, held, want)
		}
	}
	if u, err := q.Usage(ctx, "t", "p"); err != nil || u.InUse != 1 {
		t.Errorf("after the renewal: got in_use %d (%v), want 1 (the running sandbox)", u.InUse, err)
	}
}

// TestRenewKeepsASlotTheRuntimeCannotTell: when the runtime does not answer the read after a
// retake, the slot is kept and its lease decides (a pass renews it only while the sandbox holds
// it): giving it back could let a create overshoot the limit while the sandbox runs.
func TestRenewKeepsASlotTheRuntimeCannotTell(t *testing.T) {
	q, fake, s := renewFixture(t)
	ctx := context.Background()
	rec := boxIn(t, fake, Failed)
	fake.FailNext("Get", errors.New("the runtime is unreachable"))
	s.renew(ctx, map[[2]string][]string{{"t", "p"}: {rec.ID}})
	if held, err := q.Held(ctx, "t", "p", rec.ID); err != nil || !held {
		t.Errorf("after a renewal whose read failed: the slot is held: %v (%v), want true (left to its lease)", held, err)
	}
	// The next pass reads the record (FAILED): the slot, taken again once its lease is gone, goes.
	if err := q.Release(ctx, "t", "p", rec.ID); err != nil {
		t.Fatal(err)
	}
	s.renew(ctx, map[[2]string][]string{{"t", "p"}: {rec.ID}})
	if held, err := q.Held(ctx, "t", "p", rec.ID); err != nil || held {
		t.Errorf("after a renewal that read FAILED: the slot is held: %v (%v), want false", held, err)
	}
}

// renewFixture is a quota of 3 slots per project on an embedded Redis (no rebuild source) and
// the slots of a fake runtime.
func renewFixture(t *testing.T) (*quota.Quota, *runtimetest.Fake, slots) {
	rs := redistest.Embedded(t)
	none := func(context.Context, string, string) ([]string, error) { return nil, nil }
	q := quota.New(rs.Client, none, quota.Options{Limits: quota.Limits{Default: 3}, Lease: time.Minute, Settle: -1})
	fake := runtimetest.NewFakeT(t)
	return q, fake, slots{quota: q, driver: fake, log: slog.Default()}
}

// boxIn makes a box of tenant t, project p on the fake runtime, its record in state st.
func boxIn(t *testing.T, fake *runtimetest.Fake, st State) runtime.Record {
	t.Helper()
	ctx := context.Background()
	rec := runtimetest.NewRecord(runtime.BoxSpec{})
	rec.Tenant, rec.Project = "t", "p"
	if err := fake.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	rec, err := fake.UpdateRecord(ctx, rec.ID, func(r *runtime.Record) error { r.State = string(st); return nil })
	if err != nil {
		t.Fatal(err)
	}
	return rec
}
