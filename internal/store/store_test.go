package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/redis/go-redis/v9"

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
		if err != nil || !reflect.DeepEqual(got, es[3]) {
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
// TestLabelsHint: an entry keeps its labels (the list filter's hint); SetLabels replaces them
// on an existing entry only, and a hint that does not decode is none.
func TestLabelsHint(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		s := New(srv.Client, func(context.Context) ([]Entry, error) { return nil, nil })
		if err := s.EnsureBuilt(ctx); err != nil {
			t.Fatal(err)
		}
		e := newEntries(1, "t1", "p1")[0]
		e.Labels = map[string]string{"team": "ml", "example.com/tier": ""}
		if err := s.Put(ctx, e); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Get(ctx, e.ID); err != nil || !reflect.DeepEqual(got.Labels, e.Labels) {
			t.Fatalf("Get: got %v, %v, want %v", got.Labels, err, e.Labels)
		}
		if err := s.SetLabels(ctx, e.ID, map[string]string{"team": "web"}); err != nil {
			t.Fatal(err)
		}
		page, err := s.List(ctx, "t1", "p1", "", 10)
		if err != nil || len(page) != 1 || !reflect.DeepEqual(page[0].Labels, map[string]string{"team": "web"}) {
			t.Fatalf("List after SetLabels: got %+v, %v", page, err)
		}
		if err := s.SetLabels(ctx, e.ID, nil); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Get(ctx, e.ID); got.Labels != nil {
			t.Fatalf("cleared: got %v, want none", got.Labels)
		}
		if err := s.SetLabels(ctx, "sbx_"+ulid.Make().String(), map[string]string{"a": "b"}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("SetLabels of a missing entry: got %v, want ErrNotFound", err)
		}
		srv.Client.HSet(ctx, entryKey(e.ID), "labels", "{broken")
		if got, err := s.Get(ctx, e.ID); err != nil || got.Labels != nil {
			t.Fatalf("a broken hint: got %v, %v, want no labels", got.Labels, err)
		}
	})
}

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

// TestLockFencesRise: every take of a lock gets a larger fence than every take before it
// (unlock and take again, a take-over after a holder's lease ran out, another sandbox), at
// least the clock in microseconds; renewals keep the fence.
func TestLockFencesRise(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		s := New(srv.Client, nil)
		var last uint64
		next := func(what string, l *Lock) {
			t.Helper()
			if l.Fence() <= last {
				t.Fatalf("%s: got fence %d, want more than %d", what, l.Fence(), last)
			}
			last = l.Fence()
		}
		before := uint64(time.Now().UnixMicro())
		l, err := s.Lock(ctx, "sbx_a", 300*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if l.Fence() < before {
			t.Fatalf("got fence %d, want at least the clock %d", l.Fence(), before)
		}
		next("first take", l)
		time.Sleep(400 * time.Millisecond) // renewed meanwhile
		if l.Fence() != last {
			t.Fatalf("a held lock's fence changed: got %d, want %d", l.Fence(), last)
		}
		l.Unlock(ctx)
		l, err = s.Lock(ctx, "sbx_a", 300*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		next("take after unlock", l)
		other, err := s.Lock(ctx, "sbx_b", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		next("another sandbox", other)
		other.Unlock(ctx)
		// The holder pauses (no renewal, no unlock): its lease runs out and B takes over.
		close(l.stop)
		<-l.done
		time.Sleep(350 * time.Millisecond)
		b, err := s.Lock(ctx, "sbx_a", time.Second)
		if err != nil {
			t.Fatalf("take-over after the lease: %v", err)
		}
		next("take-over", b)
		b.Unlock(ctx)
	})
}

// TestLockFencesAfterFlushAll: Redis losing its data (the counter with it) does not make a new
// holder's fence lower than an old one.
func TestLockFencesAfterFlushAll(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		s := New(srv.Client, nil)
		var max uint64
		for i := 0; i < 50; i++ {
			l, err := s.Lock(ctx, fmt.Sprintf("sbx_%d", i%5), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			max = l.Fence()
			l.Unlock(ctx)
		}
		if err := srv.Client.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		l, err := s.Lock(ctx, "sbx_0", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(ctx)
		if l.Fence() <= max {
			t.Fatalf("after FLUSHALL: got fence %d, want more than %d", l.Fence(), max)
		}
	})
}

// TestLockFencesConcurrent: concurrent takes, of one sandbox and of many, never share a fence,
// and the successive holders of one sandbox's lock hold rising fences.
func TestLockFencesConcurrent(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		s := New(srv.Client, nil)
		var mu sync.Mutex
		seen := map[uint64]string{}
		var held []uint64 // fences of sbx_shared in the order they were held
		var wg sync.WaitGroup
		for i := 0; i < 16; i++ {
			wg.Go(func() {
				for j := 0; j < 20; j++ {
					id := "sbx_shared"
					if j%2 == 1 {
						id = fmt.Sprintf("sbx_own_%d_%d", i, j)
					}
					l, err := s.Lock(ctx, id, time.Second)
					if errors.Is(err, ErrLocked) {
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					if prev, dup := seen[l.Fence()]; dup {
						t.Errorf("fence %d handed out twice: to %s and %s", l.Fence(), prev, id)
					}
					seen[l.Fence()] = id
					if id == "sbx_shared" {
						held = append(held, l.Fence())
					}
					mu.Unlock()
					l.Unlock(ctx)
				}
			})
		}
		wg.Wait()
		if len(held) == 0 {
			t.Fatal("nobody ever took the shared lock")
		}
		for i := 1; i < len(held); i++ {
			if held[i] <= held[i-1] {
				t.Fatalf("holder %d of the shared lock got fence %d after %d: want rising fences", i, held[i], held[i-1])
			}
		}
		t.Logf("%d fences, %d of them for the shared lock", len(seen), len(held))
	})
}

// TestLockOvertakenBeforeItsFence: a take whose lease ran out and was taken over before it
// drew its fence (a pause between the two) is ErrLocked, and the new holder keeps the lock.
func TestLockOvertakenBeforeItsFence(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { rdb.Close() })
		var overtaken atomic.Bool
		rdb.AddHook(beforeFence(func() {
			if overtaken.Swap(true) {
				return
			}
			// Another replica's take once our lease has run out (its clock 10 s ahead).
			now := time.Now().Add(10 * time.Second).UnixMilli()
			if ok, err := lockScript.Run(ctx, srv.Client, []string{lockKey("sbx_a")}, "other", now, 60000, 0).Int(); err != nil || ok != 1 {
				t.Errorf("the other replica's take: got %d, %v", ok, err)
			}
		}))
		s := New(rdb, nil)
		if _, err := s.Lock(ctx, "sbx_a", time.Second); !errors.Is(err, ErrLocked) {
			t.Fatalf("got %v, want ErrLocked", err)
		}
		v, err := srv.Client.Get(ctx, lockKey("sbx_a")).Result()
		if err != nil || !strings.HasPrefix(v, "other|") {
			t.Fatalf("lock value: got %q, %v, want the other holder's", v, err)
		}
		// Nothing was overtaken this time: the take succeeds.
		l, err := s.Lock(ctx, "sbx_c", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		l.Unlock(ctx)
	})
}

// beforeFence is a go-redis hook that calls f before every fence is drawn.
type beforeFence func()

func (h beforeFence) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h beforeFence) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h beforeFence) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if slices.Contains(cmd.Args(), any(fenceKey)) {
			h()
		}
		return next(ctx, cmd)
	}
}

// Activity is never earlier than the lookup's last rebuild: after FLUSHALL the first read
// rebuilds and reports the rebuild's time for every sandbox; a later touch wins over it.
func TestActivityAfterFlushAll(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		now := time.Now().Add(-time.Hour).UTC().Truncate(time.Millisecond)
		clock := func() time.Time { return now }
		truth := newEntries(2, "t1", "p1")
		s := New(srv.Client, func(context.Context) ([]Entry, error) { return truth, nil }).WithClock(clock)
		a, b := truth[0].ID, truth[1].ID
		if err := s.Touch(ctx, a, now); err != nil {
			t.Fatal(err)
		}
		if err := srv.Client.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		now = now.Add(10 * time.Minute)
		acts, err := s.Activity(ctx, a, b)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{a, b} {
			if !acts[id].Equal(now) {
				t.Errorf("activity of %s after FLUSHALL: got %v, want the rebuild at %v", id, acts[id], now)
			}
		}
		if _, err := s.Get(ctx, a); err != nil {
			t.Fatalf("the activity read rebuilt the lookup: Get: %v", err)
		}
		rebuilt := now
		now = now.Add(time.Minute)
		if err := s.Touch(ctx, a, now); err != nil {
			t.Fatal(err)
		}
		acts, err = s.Activity(ctx, a, b)
		if err != nil || !acts[a].Equal(now) || !acts[b].Equal(rebuilt) {
			t.Errorf("after a touch: got %v, %v; want %s at %v and %s at the rebuild %v", acts, err, a, now, b, rebuilt)
		}
	})
}

// TestLockAfterAFlushBeforeItsFence: Redis losing the lock between its take and the renewal
// that confirms it (a FLUSHALL) leaves nobody holding it, so Lock takes it again instead of
// answering ErrLocked; the new take's fence still rises.
func TestLockAfterAFlushBeforeItsFence(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { rdb.Close() })
		var flushed atomic.Int32
		rdb.AddHook(beforeFence(func() {
			if flushed.Add(1) == 1 {
				if err := srv.Client.FlushAll(ctx).Err(); err != nil {
					t.Errorf("flushall: %v", err)
				}
			}
		}))
		s := New(rdb, nil)
		l, err := s.Lock(ctx, "sbx_a", time.Minute)
		if err != nil {
			t.Fatalf("a lock Redis lost before its renewal: got %v, want it taken again", err)
		}
		defer l.Unlock(ctx)
		if flushed.Load() < 2 {
			t.Fatalf("one fence drawn, want the lost take's and the second take's")
		}
		if v, err := srv.Client.Get(ctx, lockKey("sbx_a")).Result(); err != nil || !strings.HasPrefix(v, l.token+"|") {
			t.Fatalf("lock value: got %q, %v, want the second take's", v, err)
		}
		if _, err := s.Lock(ctx, "sbx_a", time.Minute); !errors.Is(err, ErrLocked) {
			t.Fatalf("a second Lock while the first holds it: got %v, want ErrLocked", err)
		}
	})
}

// ListActive gives each listed sandbox's activity as Activity does: the recorded time when it
// is after the lookup's last rebuild, else the rebuild's time (also right after a FLUSHALL),
// and only for the caller's project.
func TestListActive(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		truth := append(newEntries(3, "t1", "p1"), newEntries(2, "t2", "p1")...)
		s := New(srv.Client, func(context.Context) ([]Entry, error) { return truth, nil })
		used := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
		if _, err := s.List(ctx, "t1", "p1", "", 10); err != nil { // builds the lookup
			t.Fatal(err)
		}
		if err := s.Touch(ctx, truth[0].ID, used); err != nil {
			t.Fatal(err)
		}
		for _, step := range []string{"built", "after-flushall"} {
			if step == "after-flushall" {
				if err := srv.Client.FlushAll(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				used = time.Time{} // the recorded time went with the flush
			}
			entries, acts, err := s.ListActive(ctx, "t1", "p1", "", 10)
			if err != nil || len(entries) != 3 || len(acts) != 3 {
				t.Fatalf("%s: got %d entries, %d activities, %v, want 3 and 3", step, len(entries), len(acts), err)
			}
			want, err := s.Activity(ctx, truth[0].ID, truth[1].ID, truth[2].ID)
			if err != nil {
				t.Fatal(err)
			}
			for id, at := range acts {
				if !at.Equal(want[id]) {
					t.Fatalf("%s: activity of %s: got %v, want Activity's %v", step, id, at, want[id])
				}
				if id == truth[0].ID && !used.IsZero() && !at.Equal(used) {
					t.Fatalf("%s: activity of the touched sandbox: got %v, want %v", step, at, used)
				}
			}
			for _, e := range truth[3:] {
				if _, ok := acts[e.ID]; ok {
					t.Fatalf("%s: t1's list gave the activity of t2's %s", step, e.ID)
				}
			}
		}
	})
}

// pipelineCounter counts the pipelines (round trips of several commands) a client sends.
type pipelineCounter struct{ n atomic.Int64 }

func (c *pipelineCounter) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (c *pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (c *pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

// TestListPageReadAgainInOneRoundTrip: a list page read again reads its entries and activity
// in the index's round trip, and what it answers is what Redis holds at that read, never what
// the earlier read found: a changed state, label or activity, a new sandbox at the top, a
// deleted one, each shows at once (a page that changed takes the second round trip again).
func TestListPageReadAgainInOneRoundTrip(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		s := New(srv.Client, func(context.Context) ([]Entry, error) { return nil, nil })
		if err := s.EnsureBuilt(ctx); err != nil {
			t.Fatal(err)
		}
		es := newEntries(5, "t1", "p1")
		for _, e := range es {
			if err := s.Put(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		var count pipelineCounter
		srv.Client.AddHook(&count)
		// read lists the first page of 3 and returns its ids, states and activities, and the
		// round trips it took.
		read := func(step string) ([]Entry, map[string]time.Time, int64) {
			t.Helper()
			before := count.n.Load()
			page, acts, err := s.ListActive(ctx, "t1", "p1", "", 3)
			if err != nil {
				t.Fatalf("%s: %v", step, err)
			}
			return page, acts, count.n.Load() - before
		}
		ids := func(page []Entry) []string {
			var out []string
			for _, e := range page {
				out = append(out, e.ID)
			}
			return out
		}
		wantIDs := func(step string, page []Entry, want ...Entry) {
			t.Helper()
			var w []string
			for _, e := range want {
				w = append(w, e.ID)
			}
			if got := ids(page); !slices.Equal(got, w) {
				t.Fatalf("%s: page %v, want %v", step, got, w)
			}
		}

		page, _, trips := read("first read")
		wantIDs("first read", page, es[4], es[3], es[2])
		if trips != 2 {
			t.Fatalf("first read: %d round trips, want 2 (the index, then its entries)", trips)
		}
		page, _, trips = read("read again")
		wantIDs("read again", page, es[4], es[3], es[2])
		if trips != 1 {
			t.Fatalf("read again: %d round trips, want 1", trips)
		}

		// Changed values of the same ids: one round trip, the new values.
		if err := s.SetState(ctx, es[3].ID, "STOPPED"); err != nil {
			t.Fatal(err)
		}
		if err := s.SetLabels(ctx, es[2].ID, map[string]string{"team": "ml"}); err != nil {
			t.Fatal(err)
		}
		used := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
		if err := s.Touch(ctx, es[4].ID, used); err != nil {
			t.Fatal(err)
		}
		page, acts, trips := read("after changes")
		if trips != 1 || page[1].State != "STOPPED" || page[2].Labels["team"] != "ml" || !acts[es[4].ID].Equal(used) {
			t.Fatalf("after changes: %d round trips, states %s/%s, labels %v, activity %v; want 1, STOPPED, team=ml, %v",
				trips, page[0].State, page[1].State, page[2].Labels, acts[es[4].ID], used)
		}

		// A new sandbox at the top: the page moves; the new id is read in a second round trip.
		fresh := newEntries(1, "t1", "p1")[0]
		if err := s.Put(ctx, fresh); err != nil {
			t.Fatal(err)
		}
		page, acts, trips = read("after a create")
		wantIDs("after a create", page, fresh, es[4], es[3])
		if trips != 2 || page[0].Profile != fresh.Profile || len(acts) != 3 {
			t.Fatalf("after a create: %d round trips, %+v, %d activities; want 2, the new entry, 3", trips, page[0], len(acts))
		}
		if _, _, trips = read("again"); trips != 1 {
			t.Fatalf("the moved page read again: %d round trips, want 1", trips)
		}

		// A deleted sandbox leaves the page at once; one that comes up from below is read.
		if err := s.Delete(ctx, es[4]); err != nil {
			t.Fatal(err)
		}
		page, _, _ = read("after a delete")
		wantIDs("after a delete", page, fresh, es[3], es[2])
		if page[2].Labels["team"] != "ml" {
			t.Fatalf("after a delete: the entry that came up reads %+v", page[2])
		}

		// An entry whose hash says it is another project's (the index may lag the entry) is
		// left out whether it was guessed or not.
		srv.Client.HSet(ctx, entryKey(es[3].ID), "project", "p2")
		for _, step := range []string{"guessed", "guessed again"} {
			page, _, _ = read(step)
			if slices.Contains(ids(page), es[3].ID) {
				t.Fatalf("%s: the page lists %s, now another project's", step, es[3].ID)
			}
		}
		// Another project's page of the same cursor and size is its own.
		other, err := s.List(ctx, "t1", "p2", "", 3)
		if err != nil || len(other) != 0 {
			t.Fatalf("p2's page: %v, %v, want none (p2's index is empty)", ids(other), err)
		}
	})
}

// TestPageMemoBounds: the memo never holds more pages or ids than its bounds, forgets an
// emptied page, and keeps its own copy of what it was given.
func TestPageMemoBounds(t *testing.T) {
	m := newPageMemo(4, 10)
	for i := range 50 {
		ids := make([]string, i%5)
		for j := range ids {
			ids[j] = fmt.Sprintf("id%d-%d", i, j)
		}
		m.put(pageKey("t", "p", fmt.Sprint(i), 3), ids)
		total := 0
		for _, v := range m.pages {
			total += len(v)
		}
		if len(m.pages) > 4 || total > 10 || total != m.ids {
			t.Fatalf("after put %d: %d pages, %d ids (counted %d); bounds 4 and 10", i, len(m.pages), total, m.ids)
		}
	}
	given := []string{"a", "b"}
	k := pageKey("t", "p", "", 2)
	m.put(k, given)
	given[0] = "changed"
	if got := m.get(k); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("the memo's copy: %v", got)
	}
	m.put(k, nil)
	if got := m.get(k); got != nil {
		t.Fatalf("an emptied page is still remembered: %v", got)
	}
	m.put(k, make([]string, 11))
	if got := m.get(k); got != nil {
		t.Fatalf("a page over the ids bound is remembered: %d ids", len(got))
	}
	// Keys of different projects, cursors or sizes never meet.
	if pageKey("t", "p1", "", 3) == pageKey("t", "p", "1", 3) || pageKey("t", "p", "", 13) == pageKey("t", "p", "1", 3) {
		t.Fatal("page keys collide")
	}
}
