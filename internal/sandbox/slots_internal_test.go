package sandbox

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"sandboxd/internal/quota"
	"sandboxd/internal/redistest"
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
