package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

// The concurrency quota end to end (issue 4): every sandbox that is CREATING, STARTING or
// RUNNING holds one slot of its tenant:project; slots are leases in a real redis-server.

// slotsKeyT1 is the sorted set of t1:p1's slot leases (internal/quota's key schema).
const slotsKeyT1 = "quota:{t1:p1}:slots"

// quotaConfig is the config of a server whose t1:p1 may hold limit slots (every other project
// is unlimited). leaseSec and reconcileMs 0 keep sandboxd's defaults.
func quotaConfig(limit, leaseSec, reconcileMs int) map[string]any {
	q := map[string]any{"default_limit": 0, "limits": map[string]any{"t1:p1": limit}, "retry_after_sec": 2}
	cfg := map[string]any{"quota": q}
	if leaseSec > 0 {
		q["lease_sec"] = leaseSec
		// A half-done transition is finished once its lock lapses: within one lease.
		cfg["lock_ttl_sec"] = leaseSec
	}
	if reconcileMs > 0 {
		cfg["reconcile_interval_ms"] = reconcileMs
	}
	return cfg
}

// holdsSlot reports whether a sandbox in this state holds a concurrency slot.
func holdsSlot(state string) bool {
	return state == "CREATING" || state == "STARTING" || state == "RUNNING"
}

// slotHolders are the sandboxes of a listing that hold a slot.
func slotHolders(l e2e.ListJSON) []e2e.SandboxJSON {
	var out []e2e.SandboxJSON
	for _, sb := range l.Sandboxes {
		if holdsSlot(sb.State) {
			out = append(out, sb)
		}
	}
	return out
}

// describe is "id STATE (reason), …" for messages.
func describe(sbs []e2e.SandboxJSON) string {
	if len(sbs) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(sbs))
	for _, sb := range sbs {
		p := sb.SandboxID + " " + sb.State
		if sb.StateReason != "" {
			p += " (" + sb.StateReason + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}

// quotaAndHolders reads the quota and the listing of the caller's project, again until the
// quota read before and after the listing agree (nothing moved in between).
func quotaAndHolders(t *testing.T, s *e2e.Server, headers ...string) (e2e.QuotaJSON, e2e.ListJSON) {
	t.Helper()
	for try := 0; ; try++ {
		q1 := s.Quota(t, headers...)
		l := s.ListAll(t, headers...)
		q2 := s.Quota(t, headers...)
		if q1 == q2 || try == 9 {
			return q2, l
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// gauge samples a count over and over and keeps its maximum.
type gauge struct {
	mu      sync.Mutex
	n       int // samples taken
	errs    int
	lastErr error
	max     int
	maxWhat string // what the maximum sample saw
	maxAt   time.Duration
}

// run samples read every `every` until ctx ends (in its own goroutine, done with wg).
func (g *gauge) run(ctx context.Context, wg *sync.WaitGroup, every time.Duration, read func(ctx context.Context) (int, string, error)) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		start := time.Now()
		for ctx.Err() == nil {
			v, what, err := read(ctx)
			g.mu.Lock()
			switch {
			case err != nil && ctx.Err() == nil:
				g.errs++
				g.lastErr = err
			case err == nil:
				g.n++
				if v > g.max {
					g.max, g.maxWhat, g.maxAt = v, what, time.Since(start)
				}
			}
			g.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(every):
			}
		}
	}()
}

// check reports (without stopping the test) a maximum above limit, or no sample at all.
func (g *gauge) check(t *testing.T, name string, limit int) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n == 0 {
		t.Errorf("%s: got no sample (%d errors, last %v), want samples throughout", name, g.errs, g.lastErr)
		return
	}
	if g.max > limit {
		t.Errorf("%s, sampled %d times: got a maximum of %d (%s after sampling began: %s), want at most %d",
			name, g.n, g.max, g.maxAt.Round(time.Millisecond), g.maxWhat, limit)
	}
	t.Logf("%s: %d samples, maximum %d, %d errors (last %v)", name, g.n, g.max, g.errs, g.lastErr)
}

func zcardGauge(rs *redistest.Server) func(ctx context.Context) (int, string, error) {
	return func(ctx context.Context) (int, string, error) {
		n, err := rs.Client.ZCard(ctx, slotsKeyT1).Result()
		return int(n), "ZCARD " + slotsKeyT1, err
	}
}

func inUseGauge(servers ...*e2e.Server) func(ctx context.Context) (int, string, error) {
	i := 0
	return func(context.Context) (int, string, error) {
		i++
		q, err := servers[i%len(servers)].ReadQuota(e2e.HdrTenant1)
		return q.InUse, fmt.Sprintf("in_use %d of %d", q.InUse, q.Limit), err
	}
}

// quotaExceededProblem says what is wrong with an answer that must be a full project's 429:
// a Retry-After header and a QUOTA_EXCEEDED body with the limit and the count in use (the
// limit itself: a full project never counts more). "" when nothing is.
func quotaExceededProblem(r *e2e.Response, limit int) string {
	if r.Status != http.StatusTooManyRequests {
		return fmt.Sprintf("%s: got status %d, want 429", r, r.Status)
	}
	ra := r.Header.Get("Retry-After")
	secs, err := strconv.Atoi(ra)
	if err != nil || secs <= 0 {
		return fmt.Sprintf("%s: got Retry-After %q, want a positive number of seconds", r, ra)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return fmt.Sprintf("%s: got Content-Type %q, want application/json", r, ct)
	}
	var e e2e.APIError
	if err := json.Unmarshal(r.Body, &e); err != nil {
		return fmt.Sprintf("%s: decoding the error: %v", r, err)
	}
	switch {
	case e.Error.Code != "QUOTA_EXCEEDED":
		return fmt.Sprintf("%s: got code %q, want QUOTA_EXCEEDED", r, e.Error.Code)
	case e.Error.Message == "":
		return fmt.Sprintf("%s: got an empty message, want one", r)
	case e.Error.Limit == nil || *e.Error.Limit != limit:
		return fmt.Sprintf("%s: got limit %s, want %d", r, intp(e.Error.Limit), limit)
	case e.Error.InUse == nil || *e.Error.InUse != limit:
		return fmt.Sprintf("%s: got in_use %s, want %d (full, never more)", r, intp(e.Error.InUse), limit)
	case e.Error.RetryAfterSec != secs:
		return fmt.Sprintf("%s: got retry_after_sec %d, want %d (the Retry-After header)", r, e.Error.RetryAfterSec, secs)
	}
	return ""
}

func intp(p *int) string {
	if p == nil {
		return "none"
	}
	return strconv.Itoa(*p)
}
