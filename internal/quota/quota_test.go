package quota

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sandboxd/internal/apierror"
	"sandboxd/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// truth is the runtime's record of slot holders, as a test keeps it.
type truth struct {
	mu      sync.Mutex
	ids     map[string]bool
	max     int
	calls   atomic.Int64
	failErr error
}

func newTruth(ids ...string) *truth {
	tr := &truth{ids: map[string]bool{}}
	for _, id := range ids {
		tr.ids[id] = true
	}
	return tr
}

// add records id as a holder and returns the number of holders.
func (tr *truth) add(id string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.ids[id] = true
	tr.max = max(tr.max, len(tr.ids))
	return len(tr.ids)
}

func (tr *truth) remove(id string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	delete(tr.ids, id)
}

func (tr *truth) source(_ context.Context, _, _ string) ([]string, error) {
	tr.calls.Add(1)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.failErr != nil {
		return nil, tr.failErr
	}
	out := make([]string, 0, len(tr.ids))
	for id := range tr.ids {
		out = append(out, id)
	}
	return out, nil
}

// clock is a settable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newClock() *clock { return &clock{now: time.UnixMilli(1_750_000_000_000)} }

func wantExceeded(t *testing.T, err error, limit, inUse int) {
	t.Helper()
	var ae *apierror.Error
	if !errors.As(err, &ae) || ae.Code != apierror.QuotaExceeded {
		t.Fatalf("got %v, want QUOTA_EXCEEDED", err)
	}
	if ae.RetryAfter <= 0 {
		t.Fatalf("RetryAfter: got %v, want > 0", ae.RetryAfter)
	}
	if ae.Details["limit"] != limit || ae.Details["in_use"] != inUse {
		t.Fatalf("details: got %v, want limit=%d in_use=%d", ae.Details, limit, inUse)
	}
}

func TestLimitsFor(t *testing.T) {
	l := Limits{Default: 3, PerScope: map[string]int{"t:big": 10, "t:free": 0, "t:neg": -1}}
	tests := []struct {
		name            string
		limits          Limits
		tenant, project string
		want            int
	}{
		{"default", l, "t", "p", 3},
		{"per-scope", l, "t", "big", 10},
		{"per-scope-unlimited", l, "t", "free", 0},
		{"negative-is-unlimited", l, "t", "neg", 0},
		{"other-tenant", l, "u", "big", 3},
		{"zero-value", Limits{}, "t", "p", 0},
		{"negative-default", Limits{Default: -5}, "t", "p", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.limits.For(tt.tenant, tt.project); got != tt.want {
				t.Fatalf("For(%s, %s): got %d, want %d", tt.tenant, tt.project, got, tt.want)
			}
		})
	}
}

// TestAcquireRelease walks one project with limit 2 through a table of steps.
func TestAcquireRelease(t *testing.T) {
	type step struct {
		op       string // acquire, release, held
		id       string
		wantFull bool // acquire: QUOTA_EXCEEDED
		wantHeld bool // held
		wantUse  int  // slots in use after the step
	}
	steps := []step{
		{op: "acquire", id: "a", wantUse: 1},
		{op: "acquire", id: "a", wantUse: 1}, // a holder acquiring again holds one slot
		{op: "acquire", id: "b", wantUse: 2},
		{op: "acquire", id: "c", wantFull: true, wantUse: 2},
		{op: "held", id: "c", wantHeld: false, wantUse: 2},
		{op: "release", id: "c", wantUse: 2}, // a non-holder releasing is fine
		{op: "release", id: "never", wantUse: 2},
		{op: "acquire", id: "b", wantUse: 2}, // a holder still renews when the project is full
		{op: "release", id: "a", wantUse: 1},
		{op: "release", id: "a", wantUse: 1}, // twice is fine
		{op: "held", id: "a", wantHeld: false, wantUse: 1},
		{op: "acquire", id: "c", wantUse: 2}, // the freed slot goes to the next one
		{op: "held", id: "c", wantHeld: true, wantUse: 2},
		{op: "acquire", id: "a", wantFull: true, wantUse: 2},
	}
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		q := New(srv.Client, newTruth().source, Options{Limits: Limits{Default: 2}, Settle: -1})
		for i, st := range steps {
			switch st.op {
			case "acquire":
				u, err := q.Acquire(ctx, "t", "p", st.id)
				if st.wantFull {
					wantExceeded(t, err, 2, st.wantUse)
				} else if err != nil {
					t.Fatalf("step %d: acquire %s: %v", i, st.id, err)
				}
				if u != (Usage{Limit: 2, InUse: st.wantUse}) {
					t.Fatalf("step %d: acquire %s: got %+v, want limit 2, in use %d", i, st.id, u, st.wantUse)
				}
			case "release":
				if err := q.Release(ctx, "t", "p", st.id); err != nil {
					t.Fatalf("step %d: release %s: %v", i, st.id, err)
				}
			case "held":
				held, err := q.Held(ctx, "t", "p", st.id)
				if err != nil || held != st.wantHeld {
					t.Fatalf("step %d: held %s: got %v, %v, want %v", i, st.id, held, err, st.wantHeld)
				}
			}
			u, err := q.Usage(ctx, "t", "p")
			if err != nil || u != (Usage{Limit: 2, InUse: st.wantUse}) {
				t.Fatalf("step %d (%s %s): usage: got %+v, %v, want in use %d", i, st.op, st.id, u, err, st.wantUse)
			}
		}
		// Another project is untouched by all this.
		if u, err := q.Usage(ctx, "t", "other"); err != nil || u.InUse != 0 {
			t.Fatalf("other project: got %+v, %v, want in use 0", u, err)
		}
	})
}

func TestExceededError(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		q := New(srv.Client, newTruth().source, Options{Limits: Limits{Default: 1}, RetryAfter: 7 * time.Second, Settle: -1})
		if _, err := q.Acquire(ctx, "acme", "web", "a"); err != nil {
			t.Fatal(err)
		}
		_, err := q.Acquire(ctx, "acme", "web", "b")
		wantExceeded(t, err, 1, 1)
		ae := apierror.From(err)
		if ae.RetryAfter != 7*time.Second {
			t.Fatalf("RetryAfter: got %v, want 7s", ae.RetryAfter)
		}
		if got, want := ae.Code.HTTPStatus(), 429; got != want {
			t.Fatalf("status: got %d, want %d", got, want)
		}
		if want := "project acme:web is at its concurrency limit: 1 of 1 slots in use; stop or destroy a sandbox, or retry later"; ae.Message != want {
			t.Fatalf("message: got %q, want %q", ae.Message, want)
		}
	})
}

func TestPerScopeAndUnlimited(t *testing.T) {
	limits := Limits{Default: 2, PerScope: map[string]int{"t:big": 5, "t:free": 0}}
	tests := []struct {
		name      string
		limits    Limits
		project   string
		tries     int
		wantOK    int
		wantLimit int
	}{
		{"default", limits, "p", 10, 2, 2},
		{"per-scope", limits, "big", 10, 5, 5},
		{"per-scope-unlimited", limits, "free", 50, 50, 0},
		{"default-unlimited", Limits{}, "p", 50, 50, 0},
	}
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				ctx := context.Background()
				if err := srv.Client.FlushAll(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				q := New(srv.Client, newTruth().source, Options{Limits: tt.limits, Settle: -1})
				ok := 0
				for i := range tt.tries {
					_, err := q.Acquire(ctx, "t", tt.project, fmt.Sprint("s", i))
					switch {
					case err == nil:
						ok++
					case apierror.Is(err, apierror.QuotaExceeded):
					default:
						t.Fatal(err)
					}
				}
				if ok != tt.wantOK {
					t.Fatalf("acquired: got %d, want %d", ok, tt.wantOK)
				}
				u, err := q.Usage(ctx, "t", tt.project)
				if err != nil || u != (Usage{Limit: tt.wantLimit, InUse: tt.wantOK}) {
					t.Fatalf("usage: got %+v, %v, want limit %d in use %d", u, err, tt.wantLimit, tt.wantOK)
				}
			})
		}
	})
}

// TestLeaseExpiry: a holder that is never released nor renewed (a SIGKILLed replica) loses
// its slot after one lease; Renew keeps live ones and does not add missing ids.
func TestLeaseExpiry(t *testing.T) {
	const lease = 60 * time.Second
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		clk := newClock()
		q := New(srv.Client, newTruth().source, Options{Limits: Limits{Default: 2}, Lease: lease, Now: clk.Now, Settle: -1})
		for _, id := range []string{"live", "killed"} {
			if _, err := q.Acquire(ctx, "t", "p", id); err != nil {
				t.Fatal(err)
			}
		}
		_, err := q.Acquire(ctx, "t", "p", "next")
		wantExceeded(t, err, 2, 2)

		clk.advance(lease - time.Millisecond)
		missing, err := q.Renew(ctx, "t", "p", []string{"live", "ghost"})
		if err != nil || !slices.Equal(missing, []string{"ghost"}) {
			t.Fatalf("renew: got %v, %v, want [ghost]", missing, err)
		}
		if held, _ := q.Held(ctx, "t", "p", "ghost"); held {
			t.Fatal("renew added a missing id: got held, want not held")
		}
		if held, _ := q.Held(ctx, "t", "p", "killed"); !held {
			t.Fatal("killed before its lease ended: got not held, want held")
		}
		_, err = q.Acquire(ctx, "t", "p", "next")
		wantExceeded(t, err, 2, 2)

		clk.advance(time.Millisecond) // the unrenewed lease ends now
		if held, _ := q.Held(ctx, "t", "p", "killed"); held {
			t.Fatal("killed after its lease: got held, want not held")
		}
		if u, _ := q.Usage(ctx, "t", "p"); u.InUse != 1 {
			t.Fatalf("usage: got %d, want 1", u.InUse)
		}
		if missing, err := q.Renew(ctx, "t", "p", []string{"killed"}); err != nil || !slices.Equal(missing, []string{"killed"}) {
			t.Fatalf("renew of an expired lease: got %v, %v, want [killed]", missing, err)
		}
		if u, err := q.Acquire(ctx, "t", "p", "next"); err != nil || u.InUse != 2 {
			t.Fatalf("acquire after expiry: got %+v, %v, want in use 2", u, err)
		}

		// The renewed lease lasts one lease from its renewal.
		clk.advance(lease - 2*time.Millisecond)
		if held, _ := q.Held(ctx, "t", "p", "live"); !held {
			t.Fatal("renewed: got not held, want held")
		}
		clk.advance(time.Millisecond)
		if held, _ := q.Held(ctx, "t", "p", "live"); held {
			t.Fatal("renewed, after its lease: got held, want not held")
		}
		if missing, err := q.Renew(ctx, "t", "p", nil); err != nil || len(missing) != 0 {
			t.Fatalf("renew of nothing: got %v, %v", missing, err)
		}
	})
}

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

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// TestStorm: 200 concurrent acquires of distinct ids from 20 goroutines against a limit of 10.
func TestStorm(t *testing.T) {
	const (
		limit   = 10
		clients = 20
		total   = 200
	)
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		q := New(srv.Client, newTruth().source, Options{Limits: Limits{Default: limit}})
		if _, err := q.Usage(ctx, "t", "p"); err != nil { // builds the (empty) set
			t.Fatal(err)
		}

		ids := make(chan string, total)
		for i := range total {
			ids <- fmt.Sprintf("sbx_%03d", i)
		}
		close(ids)

		stop := make(chan struct{})
		var sampler sync.WaitGroup
		var samples, maxSeen int64
		sampler.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				n, err := srv.Client.ZCard(ctx, scopeOf("t", "p").slots).Result()
				if err != nil {
					t.Error(err)
					return
				}
				samples++
				maxSeen = max(maxSeen, n)
			}
		})

		var mu sync.Mutex
		var ok, exceeded []string
		var acquireLat []time.Duration
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range clients {
			wg.Go(func() {
				<-start
				for id := range ids {
					t0 := time.Now()
					_, err := q.Acquire(ctx, "t", "p", id)
					d := time.Since(t0)
					mu.Lock()
					acquireLat = append(acquireLat, d)
					switch {
					case err == nil:
						ok = append(ok, id)
					case apierror.Is(err, apierror.QuotaExceeded):
						exceeded = append(exceeded, id)
						ae := apierror.From(err)
						if ae.RetryAfter <= 0 || ae.Details["limit"] != limit || ae.Details["in_use"] != limit {
							t.Errorf("%s: got RetryAfter %v, details %v, want > 0, limit=%d in_use=%d", id, ae.RetryAfter, ae.Details, limit, limit)
						}
					default:
						t.Errorf("%s: %v", id, err)
					}
					mu.Unlock()
				}
			})
		}
		began := time.Now()
		close(start)
		wg.Wait()
		storm := time.Since(began)

		if len(ok) != limit || len(exceeded) != total-limit {
			t.Fatalf("got %d acquired, %d QUOTA_EXCEEDED, want %d, %d", len(ok), len(exceeded), limit, total-limit)
		}
		if u, err := q.Usage(ctx, "t", "p"); err != nil || u.InUse != limit {
			t.Fatalf("usage after the storm: got %+v, %v, want in use %d", u, err, limit)
		}

		// Release all 200 (10 holders, 190 non-holders) from 20 goroutines.
		all := make(chan string, total)
		for _, id := range append(slices.Clone(ok), exceeded...) {
			all <- id
		}
		close(all)
		var releaseLat []time.Duration
		for range clients {
			wg.Go(func() {
				for id := range all {
					t0 := time.Now()
					err := q.Release(ctx, "t", "p", id)
					d := time.Since(t0)
					if err != nil {
						t.Error(err)
					}
					mu.Lock()
					releaseLat = append(releaseLat, d)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		close(stop)
		sampler.Wait()

		if maxSeen > limit {
			t.Fatalf("sampled slots in use: got max %d, want <= %d", maxSeen, limit)
		}
		if samples < 10 {
			t.Fatalf("sampler: got %d samples, want >= 10", samples)
		}
		if u, err := q.Usage(ctx, "t", "p"); err != nil || u.InUse != 0 {
			t.Fatalf("usage after releasing all: got %+v, %v, want in use 0", u, err)
		}
		t.Logf("storm: %d acquires from %d goroutines in %v: %d acquired, %d QUOTA_EXCEEDED; %d ZCARD samples, max %d",
			total, clients, storm.Round(time.Microsecond), len(ok), len(exceeded), samples, maxSeen)
		t.Logf("acquire latency: median %v, p99 %v, max %v (n=%d, 20 concurrent)",
			percentile(acquireLat, 0.5), percentile(acquireLat, 0.99), percentile(acquireLat, 1), len(acquireLat))
		t.Logf("release latency: median %v, p99 %v, max %v (n=%d, 20 concurrent)",
			percentile(releaseLat, 0.5), percentile(releaseLat, 0.99), percentile(releaseLat, 1), len(releaseLat))
	})
}

// TestFlushAllUnderLoad: workers acquire and release while another goroutine FLUSHALLs
// repeatedly; Source returns the true holders. The true holders never exceed the limit.
func TestFlushAllUnderLoad(t *testing.T) {
	const (
		limit    = 5
		workers  = 16
		duration = 3 * time.Second
	)
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		tr := newTruth()
		q := New(srv.Client, tr.source, Options{Limits: Limits{Default: limit}, Settle: 50 * time.Millisecond})
		deadline := time.Now().Add(duration)
		var acquired, full, flushes, samples atomic.Int64
		var maxSlots atomic.Int64
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 1))
				for i := 0; time.Now().Before(deadline); i++ {
					id := fmt.Sprintf("w%02d-%05d", w, i)
					_, err := q.Acquire(ctx, "t", "p", id)
					switch {
					case err == nil:
						acquired.Add(1)
						if n := tr.add(id); n > limit {
							t.Errorf("true holders: got %d, want <= %d", n, limit)
						}
						time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
						tr.remove(id) // the runtime stops it, then the slot is given back
						if err := q.Release(ctx, "t", "p", id); err != nil {
							t.Error(err)
						}
					case apierror.Is(err, apierror.QuotaExceeded):
						full.Add(1)
						time.Sleep(time.Duration(rng.IntN(1000)) * time.Microsecond)
					default:
						t.Errorf("%s: %v", id, err)
						return
					}
				}
			})
		}
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(99, 1))
			for time.Now().Before(deadline) {
				// Longer than a rebuild (Settle + a listing), so that a rebuild is sometimes,
				// but not always, cut short by the next FLUSHALL.
				time.Sleep(time.Duration(80+rng.IntN(120)) * time.Millisecond)
				if err := srv.Client.FlushAll(ctx).Err(); err != nil {
					t.Error(err)
					return
				}
				flushes.Add(1)
			}
		})
		wg.Go(func() {
			for time.Now().Before(deadline) {
				n, err := srv.Client.ZCard(ctx, scopeOf("t", "p").slots).Result()
				if err != nil {
					t.Error(err)
					return
				}
				samples.Add(1)
				if n > maxSlots.Load() {
					maxSlots.Store(n)
				}
				time.Sleep(100 * time.Microsecond)
			}
		})
		wg.Wait()

		if m := tr.max; m > limit {
			t.Fatalf("true holders: got max %d, want <= %d", m, limit)
		}
		if m := maxSlots.Load(); m > limit {
			t.Fatalf("sampled slots: got max %d, want <= %d", m, limit)
		}
		if flushes.Load() < 10 || acquired.Load() < 100 {
			t.Fatalf("load: got %d flushes, %d acquired, want >= 10, >= 100", flushes.Load(), acquired.Load())
		}
		// Nothing leaked: with every holder gone, no slot is in use.
		if u, err := q.Usage(ctx, "t", "p"); err != nil || u.InUse != 0 {
			t.Fatalf("usage at the end: got %+v, %v, want in use 0", u, err)
		}
		t.Logf("%d FLUSHALLs; %d acquired, %d QUOTA_EXCEEDED; max true holders %d, max sampled slots %d (%d samples); %d rebuild listings",
			flushes.Load(), acquired.Load(), full.Load(), tr.max, maxSlots.Load(), samples.Load(), tr.calls.Load())
	})
}
