package quota

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sandboxd/internal/apierror"
	"sandboxd/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
		wantHeld bool // held; acquire: the answer's Held (a renewal)
		wantUse  int  // slots in use after the step
	}
	steps := []step{
		{op: "acquire", id: "a", wantUse: 1},
		{op: "acquire", id: "a", wantHeld: true, wantUse: 1}, // a holder acquiring again holds one slot
		{op: "acquire", id: "b", wantUse: 2},
		{op: "acquire", id: "c", wantFull: true, wantUse: 2},
		{op: "held", id: "c", wantHeld: false, wantUse: 2},
		{op: "release", id: "c", wantUse: 2}, // a non-holder releasing is fine
		{op: "release", id: "never", wantUse: 2},
		{op: "acquire", id: "b", wantHeld: true, wantUse: 2}, // a holder still renews when the project is full
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
				if u != (Usage{Limit: 2, InUse: st.wantUse, Held: st.wantHeld}) {
					t.Fatalf("step %d: acquire %s: got %+v, want limit 2, in use %d, held %v", i, st.id, u, st.wantUse, st.wantHeld)
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
