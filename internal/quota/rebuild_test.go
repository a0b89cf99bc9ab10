package quota

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"sandboxd/internal/redistest"
)

// TestRebuild: after FLUSHALL the set is rebuilt from Source before anything is granted,
// by Acquire, Usage, Held and Renew alike.
func TestRebuild(t *testing.T) {
	ops := []struct {
		name  string
		check func(t *testing.T, q *Quota)
	}{
		{"acquire", func(t *testing.T, q *Quota) {
			if u, err := q.Acquire(context.Background(), "t", "p", "c"); err != nil || u.InUse != 3 {
				t.Fatalf("acquire: got %+v, %v, want in use 3", u, err)
			}
			_, err := q.Acquire(context.Background(), "t", "p", "d")
			wantExceeded(t, err, 3, 3)
		}},
		{"usage", func(t *testing.T, q *Quota) {
			if u, err := q.Usage(context.Background(), "t", "p"); err != nil || u.InUse != 2 {
				t.Fatalf("usage: got %+v, %v, want in use 2", u, err)
			}
		}},
		{"held", func(t *testing.T, q *Quota) {
			if held, err := q.Held(context.Background(), "t", "p", "a"); err != nil || !held {
				t.Fatalf("held: got %v, %v, want true", held, err)
			}
		}},
		{"renew", func(t *testing.T, q *Quota) {
			missing, err := q.Renew(context.Background(), "t", "p", []string{"a", "b", "x"})
			if err != nil || !slices.Equal(missing, []string{"x"}) {
				t.Fatalf("renew: got %v, %v, want [x]", missing, err)
			}
		}},
	}
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		for _, op := range ops {
			t.Run(op.name, func(t *testing.T) {
				ctx := context.Background()
				tr := newTruth()
				q := New(srv.Client, tr.source, Options{Limits: Limits{Default: 3}, Settle: -1})
				for _, id := range []string{"a", "b"} {
					if _, err := q.Acquire(ctx, "t", "p", id); err != nil {
						t.Fatal(err)
					}
					tr.add(id)
				}
				if err := srv.Client.FlushAll(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				before := tr.calls.Load()
				op.check(t, q)
				if got := tr.calls.Load() - before; got != 1 {
					t.Fatalf("source calls: got %d, want 1", got)
				}
				if err := srv.Client.FlushAll(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			})
		}
	})
}

// TestRebuildSkipsReleased: a release while the set is lost is not undone by a rebuild whose
// listing still shows the released id.
func TestRebuildSkipsReleased(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		stale := newTruth("a", "b") // the listing, taken before a was released
		q := New(srv.Client, stale.source, Options{Limits: Limits{Default: 2}, Settle: -1})
		if err := srv.Client.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := q.Release(ctx, "t", "p", "a"); err != nil {
			t.Fatal(err)
		}
		u, err := q.Usage(ctx, "t", "p")
		if err != nil || u.InUse != 1 {
			t.Fatalf("usage: got %+v, %v, want in use 1", u, err)
		}
		if held, _ := q.Held(ctx, "t", "p", "a"); held {
			t.Fatal("released id: got held, want not held")
		}
		// The tombstones went with the rebuild: a later acquire of a is an ordinary one.
		if n, _ := srv.Client.Exists(ctx, scopeOf("t", "p").released).Result(); n != 0 {
			t.Fatalf("tombstones after rebuild: got %d keys, want 0", n)
		}
		if _, err := q.Acquire(ctx, "t", "p", "a"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestRebuildAbortsWhenFlushedAgain: a rebuild that began before another FLUSHALL (which took
// its tombstones) changes nothing, and the next try rebuilds afresh.
func TestRebuildAbortsWhenFlushedAgain(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		s := scopeOf("t", "p")
		q := New(srv.Client, nil, Options{Limits: Limits{Default: 2}, Settle: -1})
		q.source = func(ctx context.Context, _, _ string) ([]string, error) {
			// The listing still shows a; a is released, then Redis is flushed again.
			if err := q.Release(ctx, "t", "p", "a"); err != nil {
				return nil, err
			}
			if err := srv.Client.FlushAll(ctx).Err(); err != nil {
				return nil, err
			}
			return []string{"a"}, nil
		}
		if err := q.rebuildOnce(ctx, s); err != nil {
			t.Fatal(err)
		}
		if n, _ := srv.Client.Exists(ctx, s.built, s.slots).Result(); n != 0 {
			t.Fatalf("after an aborted rebuild: got %d of built, slots, want 0", n)
		}
		q.source = newTruth().source
		if u, err := q.Usage(ctx, "t", "p"); err != nil || u.InUse != 0 {
			t.Fatalf("usage: got %+v, %v, want in use 0", u, err)
		}
	})
}

// TestRebuildWaitsForGrantInFlight: a slot granted just before a FLUSHALL but recorded by the
// runtime only afterwards (within Settle) is still counted by the rebuild.
func TestRebuildWaitsForGrantInFlight(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		tr := newTruth()
		q := New(srv.Client, tr.source, Options{Limits: Limits{Default: 1}, Settle: 300 * time.Millisecond})
		if _, err := q.Acquire(ctx, "t", "p", "a"); err != nil {
			t.Fatal(err)
		}
		if err := srv.Client.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := q.Acquire(ctx, "t", "p", "b")
			errc <- err
		}()
		time.Sleep(50 * time.Millisecond)
		tr.add("a") // the runtime records a's create only now
		wantExceeded(t, <-errc, 1, 1)
	})
}

func TestSourceError(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		tr := newTruth()
		tr.failErr = errors.New("runtime down")
		q := New(srv.Client, tr.source, Options{Limits: Limits{Default: 1}, Settle: -1})
		if _, err := q.Acquire(ctx, "t", "p", "a"); err == nil || !errors.Is(err, tr.failErr) {
			t.Fatalf("got %v, want the source's error", err)
		}
		if n, _ := srv.Client.ZCard(ctx, scopeOf("t", "p").slots).Result(); n != 0 {
			t.Fatalf("slots after a failed rebuild: got %d, want 0", n)
		}
	})
}

func TestCancelledWhileRebuilding(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		tr := newTruth()
		q := New(srv.Client, tr.source, Options{Limits: Limits{Default: 1}, Settle: 200 * time.Millisecond})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if _, err := q.Acquire(ctx, "t", "p", "a"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want context.DeadlineExceeded", err)
		}
		// The detached rebuild still completes; a later caller finds the set built.
		if _, err := q.Acquire(context.Background(), "t", "p", "a"); err != nil {
			t.Fatal(err)
		}
	})
}
