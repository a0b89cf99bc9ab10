package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"sandboxd/internal/redistest"
)

func newEntries(n int, tenant, project string) []Entry {
	out := make([]Entry, n)
	for i := range out {
		out[i] = Entry{ID: "sbx_" + ulid.Make().String(), Tenant: tenant, Project: project, State: "RUNNING",
			Profile: "p", CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
		time.Sleep(2 * time.Millisecond) // distinct ULID times, so the order is the creation order
	}
	return out
}

func TestPutGetListDelete(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		s := New(srv.Client, func(context.Context) ([]Entry, error) { return nil, nil })
		if err := s.EnsureBuilt(ctx); err != nil {
			t.Fatal(err)
		}
		es := newEntries(7, "t1", "p1")
		other := newEntries(1, "t2", "p1")[0]
		for _, e := range append(es, other) {
			if err := s.Put(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.Get(ctx, es[3].ID)
		if err != nil || got != es[3] {
			t.Fatalf("Get: got %+v, %v, want %+v", got, err, es[3])
		}
		// Pages of 3, newest first, no overlap, nothing of the other tenant.
		var seen []string
		after := ""
		for {
			page, err := s.List(ctx, "t1", "p1", after, 3)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range page {
				seen = append(seen, e.ID)
			}
			if len(page) < 3 {
				break
			}
			after = page[len(page)-1].ID
		}
		if len(seen) != len(es) {
			t.Fatalf("listed %d, want %d", len(seen), len(es))
		}
		for i, id := range seen {
			if want := es[len(es)-1-i].ID; id != want {
				t.Fatalf("item %d: got %s, want %s", i, id, want)
			}
		}
		if err := s.SetState(ctx, es[0].ID, "STOPPED"); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Get(ctx, es[0].ID); got.State != "STOPPED" {
			t.Fatalf("state: got %s, want STOPPED", got.State)
		}
		if err := s.Delete(ctx, es[0]); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, es[0].ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("after delete: got %v, want ErrNotFound", err)
		}
		if err := s.SetState(ctx, es[0].ID, "RUNNING"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("SetState of a deleted entry: got %v, want ErrNotFound (no resurrection)", err)
		}
	})
}

// TestRebuildAfterFlushAll: the lookup comes back from the runtime's truth after FLUSHALL.
func TestRebuildAfterFlushAll(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		truth := newEntries(5, "t1", "p1")
		var listed atomic.Int32
		s := New(srv.Client, func(context.Context) ([]Entry, error) {
			listed.Add(1)
			return truth, nil
		})
		// First use builds the lookup from the runtime.
		page, err := s.List(ctx, "t1", "p1", "", 10)
		if err != nil || len(page) != 5 {
			t.Fatalf("first list: got %d, %v, want 5", len(page), err)
		}
		if err := srv.Client.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		// A Get after the flush finds the sandbox again (one rebuild, not one per call).
		var wg sync.WaitGroup
		for _, e := range truth {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := s.Get(ctx, e.ID)
				if err != nil || got.Tenant != "t1" {
					t.Errorf("Get %s after FLUSHALL: got %+v, %v", e.ID, got, err)
				}
			}()
		}
		wg.Wait()
		if n := listed.Load(); n < 2 || n > 3 {
			t.Fatalf("runtime listed %d times, want 2 (or 3 if a rebuild raced)", n)
		}
		page, err = s.List(ctx, "t1", "p1", "", 10)
		if err != nil || len(page) != 5 {
			t.Fatalf("list after FLUSHALL: got %d, %v, want 5", len(page), err)
		}
		if _, err := s.Get(ctx, "sbx_"+ulid.Make().String()); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown id: got %v, want ErrNotFound", err)
		}
	})
}

func TestLockIsExclusiveAndExpires(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		s := New(srv.Client, nil)
		l, err := s.Lock(ctx, "sbx_a", 300*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Lock(ctx, "sbx_a", time.Second); !errors.Is(err, ErrLocked) {
			t.Fatalf("second lock: got %v, want ErrLocked", err)
		}
		// Held past its ttl: the renewal keeps it ours.
		time.Sleep(700 * time.Millisecond)
		if _, err := s.Lock(ctx, "sbx_a", time.Second); !errors.Is(err, ErrLocked) {
			t.Fatalf("lock while renewed: got %v, want ErrLocked", err)
		}
		l.Unlock(ctx)
		l2, err := s.Lock(ctx, "sbx_a", time.Second)
		if err != nil {
			t.Fatalf("lock after unlock: %v", err)
		}
		l2.Unlock(ctx)

		// A holder that died (never renews, never unlocks) loses the lock after its lease.
		ok, err := lockScript.Run(ctx, srv.Client, []string{lockKey("sbx_b")}, "dead", time.Now().UnixMilli(), 200, 0).Int()
		if err != nil || ok != 1 {
			t.Fatalf("dead holder lock: %v %v", ok, err)
		}
		if _, err := s.Lock(ctx, "sbx_b", time.Second); !errors.Is(err, ErrLocked) {
			t.Fatalf("got %v, want ErrLocked before the lease ends", err)
		}
		time.Sleep(250 * time.Millisecond)
		l3, err := s.Lock(ctx, "sbx_b", time.Second)
		if err != nil {
			t.Fatalf("lock after a dead holder's lease: %v", err)
		}
		l3.Unlock(ctx)
	})
}

func TestLockContention(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		s := New(srv.Client, nil)
		var holders, maxHolders, wins atomic.Int32
		var wg sync.WaitGroup
		for i := 0; i < 20; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < 10; j++ {
					l, err := s.Lock(ctx, "sbx_c", time.Second)
					if errors.Is(err, ErrLocked) {
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					n := holders.Add(1)
					for {
						m := maxHolders.Load()
						if n <= m || maxHolders.CompareAndSwap(m, n) {
							break
						}
					}
					wins.Add(1)
					time.Sleep(time.Millisecond)
					holders.Add(-1)
					l.Unlock(ctx)
				}
			}()
		}
		wg.Wait()
		if maxHolders.Load() != 1 {
			t.Fatalf("got %d holders at once, want 1", maxHolders.Load())
		}
		if wins.Load() == 0 {
			t.Fatal("nobody ever got the lock")
		}
		fmt.Fprintf(testWriter{t}, "lock won %d times of 200 tries\n", wins.Load())
	})
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }
