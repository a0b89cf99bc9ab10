package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/internal/redistest"
)

// The concurrency quota end to end (issue 4): every sandbox that is CREATING, STARTING or
// RUNNING holds one slot of its tenant:project; slots are leases in a real redis-server.

// slotsKeyT1 is the sorted set of t1:p1's slot leases (internal/quota's key schema).
const slotsKeyT1 = "quota:{t1:p1}:slots"

const createBody = `{"profile":"sandboxes-default"}`

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

type quotaJSON struct {
	Limit int `json:"limit"`
	InUse int `json:"in_use"`
}

// readQuota is GET …/quota (safe in goroutines: it does not touch t).
func (s *Server) readQuota(headers ...string) (quotaJSON, error) {
	r, err := s.send(http.MethodGet, prefix+"/quota", nil, headers...)
	if err != nil {
		return quotaJSON{}, err
	}
	if r.Status != http.StatusOK {
		return quotaJSON{}, fmt.Errorf("%s: got status %d, want 200", r, r.Status)
	}
	var q quotaJSON
	if err := json.Unmarshal(r.Body, &q); err != nil {
		return quotaJSON{}, fmt.Errorf("%s: decoding: %v", r, err)
	}
	return q, nil
}

// quota is GET …/quota (200).
func (s *Server) quota(t *testing.T, headers ...string) quotaJSON {
	t.Helper()
	q, err := s.readQuota(headers...)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// readList lists up to 500 of the caller's sandboxes (safe in goroutines).
func (s *Server) readList(headers ...string) (listJSON, error) {
	r, err := s.send(http.MethodGet, prefix+"?limit=500", nil, headers...)
	if err != nil {
		return listJSON{}, err
	}
	if r.Status != http.StatusOK {
		return listJSON{}, fmt.Errorf("%s: got status %d, want 200", r, r.Status)
	}
	var l listJSON
	if err := json.Unmarshal(r.Body, &l); err != nil {
		return listJSON{}, fmt.Errorf("%s: decoding: %v", r, err)
	}
	return l, nil
}

// listAll lists up to 500 of the caller's sandboxes (200).
func (s *Server) listAll(t *testing.T, headers ...string) listJSON {
	t.Helper()
	l, err := s.readList(headers...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// holdsSlot reports whether a sandbox in this state holds a concurrency slot.
func holdsSlot(state string) bool {
	return state == "CREATING" || state == "STARTING" || state == "RUNNING"
}

// slotHolders are the sandboxes of a listing that hold a slot.
func slotHolders(l listJSON) []sandboxJSON {
	var out []sandboxJSON
	for _, sb := range l.Sandboxes {
		if holdsSlot(sb.State) {
			out = append(out, sb)
		}
	}
	return out
}

// describe is "id STATE (reason), …" for messages.
func describe(sbs []sandboxJSON) string {
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
func (s *Server) quotaAndHolders(t *testing.T, headers ...string) (quotaJSON, listJSON) {
	t.Helper()
	for try := 0; ; try++ {
		q1 := s.quota(t, headers...)
		l := s.listAll(t, headers...)
		q2 := s.quota(t, headers...)
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

func inUseGauge(servers ...*Server) func(ctx context.Context) (int, string, error) {
	i := 0
	return func(context.Context) (int, string, error) {
		i++
		q, err := servers[i%len(servers)].readQuota(hdrTenant1)
		return q.InUse, fmt.Sprintf("in_use %d of %d", q.InUse, q.Limit), err
	}
}

// quotaExceededProblem says what is wrong with an answer that must be a full project's 429:
// a Retry-After header and a QUOTA_EXCEEDED body with the limit and the count in use (the
// limit itself: a full project never counts more). "" when nothing is.
func quotaExceededProblem(r *Response, limit int) string {
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
	var e apiError
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

// percentile of sorted durations (p in [0,1]).
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, int(p*float64(len(d))))]
}

// TestQuotaStorm: 200 concurrent creates from 20 clients against a limit of 10 on a real
// redis-server: exactly 10 succeed, 190 get 429 with Retry-After, and the count in use, sampled
// throughout (ZCARD of the slots and GET …/quota), never exceeds 10. Once with one replica,
// again with two (clients split between them). Destroying the 10 gives every slot back.
func TestQuotaStorm(t *testing.T) {
	requireComponents(t)
	t.Run("one-replica", func(t *testing.T) {
		rs := redistest.Start(t)
		s := startServer(t, serverOptions{RedisURL: rs.URL, Extra: quotaConfig(10, 0, 0)})
		storm(t, rs, []*Server{s})
	})
	t.Run("two-replicas", func(t *testing.T) {
		rs := redistest.Start(t)
		storm(t, rs, replicasWith(t, serverOptions{RedisURL: rs.URL, Extra: quotaConfig(10, 0, 0)}, 2))
	})
}

type stormResult struct {
	server  *Server
	resp    *Response
	err     error
	latency time.Duration
}

func storm(t *testing.T, rs *redistest.Server, servers []*Server) {
	const limit, clients, perClient = 10, 20, 10
	if q := servers[0].quota(t, hdrTenant1); q != (quotaJSON{Limit: limit}) {
		t.Fatalf("quota before the storm: got %+v, want limit %d, in_use 0", q, limit)
	}

	sampling, stopSampling := context.WithCancel(context.Background())
	defer stopSampling()
	var swg sync.WaitGroup
	zcard, inUse := &gauge{}, &gauge{}
	zcard.run(sampling, &swg, 2*time.Millisecond, zcardGauge(rs))
	inUse.run(sampling, &swg, 5*time.Millisecond, inUseGauge(servers...))

	// 20 clients, each with its own connections, each firing its 10 creates at once: 200 in
	// flight together, released by one barrier.
	results := make([]stormResult, clients*perClient)
	begin := make(chan struct{})
	var cwg sync.WaitGroup
	for c := range clients {
		srv := servers[c%len(servers)]
		hc := &http.Client{Timeout: 10 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: perClient}}
		defer hc.CloseIdleConnections()
		for k := range perClient {
			cwg.Add(1)
			go func(slot int) {
				defer cwg.Done()
				<-begin
				start := time.Now()
				r, err := srv.sendVia(context.Background(), hc, http.MethodPost, prefix, strings.NewReader(createBody), hdrJSON, hdrTenant1)
				results[slot] = stormResult{server: srv, resp: r, err: err, latency: time.Since(start)}
			}(c*perClient + k)
		}
	}
	time.Sleep(50 * time.Millisecond) // every client at the barrier
	stormStart := time.Now()
	close(begin)
	cwg.Wait()
	took := time.Since(stormStart)

	type made struct {
		id     string
		server *Server
	}
	var created []made
	var lat201, lat429 []time.Duration
	var unexpected, bad429 []string
	for _, res := range results {
		if res.err != nil {
			unexpected = append(unexpected, res.err.Error())
			continue
		}
		switch res.resp.Status {
		case http.StatusCreated:
			var sb sandboxJSON
			if err := json.Unmarshal(res.resp.Body, &sb); err != nil || sb.SandboxID == "" {
				unexpected = append(unexpected, fmt.Sprintf("%s: undecodable (%v)", res.resp, err))
				continue
			}
			res.server.track(sb.SandboxID, hdrTenant1)
			created = append(created, made{sb.SandboxID, res.server})
			lat201 = append(lat201, res.latency)
			if sb.State != "RUNNING" {
				unexpected = append(unexpected, fmt.Sprintf("%s: got state %q, want RUNNING", res.resp, sb.State))
			}
		case http.StatusTooManyRequests:
			lat429 = append(lat429, res.latency)
			if p := quotaExceededProblem(res.resp, limit); p != "" {
				bad429 = append(bad429, p)
			}
		default:
			unexpected = append(unexpected, res.resp.String())
		}
	}
	// Keep sampling a little after the storm: nothing may creep over the limit later either.
	time.Sleep(300 * time.Millisecond)
	stopSampling()
	swg.Wait()

	slices.Sort(lat201)
	slices.Sort(lat429)
	t.Logf("storm figures (%d replica(s)): %d creates from %d clients took %s; %d answered 201 (latency median %s, max %s), "+
		"%d answered 429 (latency median %s, p90 %s, max %s); sampled maximum: ZCARD %d over %d samples, in_use %d over %d samples",
		len(servers), clients*perClient, clients, took.Round(time.Millisecond),
		len(lat201), percentile(lat201, 0.5).Round(time.Millisecond), percentile(lat201, 1).Round(time.Millisecond),
		len(lat429), percentile(lat429, 0.5).Round(time.Millisecond), percentile(lat429, 0.9).Round(time.Millisecond),
		percentile(lat429, 1).Round(time.Millisecond), zcard.max, zcard.n, inUse.max, inUse.n)

	if len(created) != limit {
		t.Errorf("got %d creates answered 201, want exactly %d", len(created), limit)
	}
	if len(lat429) != clients*perClient-limit {
		t.Errorf("got %d creates answered 429, want %d", len(lat429), clients*perClient-limit)
	}
	for i, u := range unexpected {
		if i == 5 {
			t.Errorf("… and %d more unexpected answers", len(unexpected)-5)
			break
		}
		t.Errorf("unexpected answer to a create: %s", u)
	}
	for i, p := range bad429 {
		if i == 5 {
			t.Errorf("… and %d more bad 429 answers", len(bad429)-5)
			break
		}
		t.Error(p)
	}
	zcard.check(t, "ZCARD "+slotsKeyT1, limit)
	inUse.check(t, "GET "+prefix+"/quota in_use", limit)

	q, l := servers[0].quotaAndHolders(t, hdrTenant1)
	if h := slotHolders(l); q.InUse != len(created) || len(h) != len(created) {
		t.Errorf("after the storm: got in_use %d and %d listed holders (%s), want %d each", q.InUse, len(h), describe(h), len(created))
	}

	// Destroy all, each through another replica than the one that created it.
	errs := make(chan string, len(created))
	var dwg sync.WaitGroup
	for i, m := range created {
		dwg.Add(1)
		go func() {
			defer dwg.Done()
			srv := servers[(i+1)%len(servers)]
			r, err := srv.send(http.MethodDelete, prefix+"/"+m.id, nil, hdrTenant1)
			switch {
			case err != nil:
				errs <- err.Error()
			case r.Status != http.StatusOK:
				errs <- fmt.Sprintf("%s: got status %d, want 200", r, r.Status)
			}
		}()
	}
	dwg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	for _, srv := range servers {
		if q := srv.quota(t, hdrTenant1); q != (quotaJSON{Limit: limit}) {
			t.Errorf("quota after destroying all on %s: got %+v, want in_use 0 of %d", srv.URL, q, limit)
		}
	}
	if n, err := rs.Client.ZCard(context.Background(), slotsKeyT1).Result(); err != nil || n != 0 {
		t.Errorf("ZCARD %s after destroying all: got %d (%v), want 0", slotsKeyT1, n, err)
	}
}

// TestQuotaKillDuringCreate: a replica killed with SIGKILL in the middle of a create leaks no
// slot. Replicas on one Redis and state folder, lease_sec 3, a limit of 1: within one lease plus
// two reconcile intervals of the kill, replica B's in_use equals the sandboxes it lists as
// CREATING, STARTING or RUNNING (a box that never came up gave its slot back; one that did is
// listed and holds it rightly). Whatever is left settles, is destroyable, and the project's one
// slot can be taken again. Twice: a kill ~150 ms into the create (the box is being made), and
// a kill the moment the slot appears in Redis (before the box exists).
func TestQuotaKillDuringCreate(t *testing.T) {
	requireComponents(t)
	const limit, leaseSec, reconcileMs = 1, 3, 500
	rs := redistest.Start(t)
	reps := replicasWith(t, serverOptions{RedisURL: rs.URL, Extra: quotaConfig(limit, leaseSec, reconcileMs)}, 3)
	b := reps[2]
	k := killCase{rs: rs, b: b, limit: limit, lease: leaseSec * time.Second, reconcile: reconcileMs * time.Millisecond}

	t.Run("150ms-into-the-create", func(t *testing.T) {
		k.run(t, reps[0], func(began time.Time) {
			time.Sleep(time.Until(began.Add(150 * time.Millisecond)))
			// The kill is meant to land after the slot was taken: on a slow machine, wait for it.
			k.waitForSlot(t, 5*time.Second, time.Millisecond)
		})
	})
	t.Run("as-the-slot-is-taken", func(t *testing.T) {
		k.run(t, reps[1], func(time.Time) { k.waitForSlot(t, 5*time.Second, 0) })
	})
}

type killCase struct {
	rs               *redistest.Server
	b                *Server
	limit            int
	lease, reconcile time.Duration
}

// waitForSlot polls t1:p1's slots until one is taken.
func (k killCase) waitForSlot(t *testing.T, timeout, every time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		n, err := k.rs.Client.ZCard(context.Background(), slotsKeyT1).Result()
		if err == nil && n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the create on A took no slot within %s (ZCARD %d, %v), want one", timeout, n, err)
		}
		if every > 0 {
			time.Sleep(every)
		}
	}
}

// run creates on a, kills a with SIGKILL when killAt returns, and checks what replica b sees.
func (k killCase) run(t *testing.T, a *Server, killAt func(began time.Time)) {
	b := k.b
	ctx := context.Background()
	// A create and destroy first, so that the killed create is not A's cold first request.
	warm := a.create(t, createBody, hdrTenant1).SandboxID
	a.curl(t, http.MethodDelete, prefix+"/"+warm, nil, hdrTenant1).want(t, http.StatusOK)
	if q := b.quota(t, hdrTenant1); q.InUse != 0 {
		t.Fatalf("before the kill: got in_use %d, want 0", q.InUse)
	}

	type answer struct {
		r   *Response
		err error
	}
	done := make(chan answer, 1)
	began := time.Now()
	go func() {
		r, err := a.send(http.MethodPost, prefix, strings.NewReader(createBody), hdrJSON, hdrTenant1)
		done <- answer{r, err}
	}()
	killAt(began)
	a.Kill(t)
	killedAt := time.Now()
	slotsAfterKill, _ := k.rs.Client.ZRange(ctx, slotsKeyT1, 0, -1).Result()
	ans := <-done
	switch {
	case ans.err != nil:
		t.Logf("the create on A was cut by SIGKILL %s after it began: %v", killedAt.Sub(began).Round(time.Millisecond), ans.err)
	case ans.r.Status == http.StatusCreated:
		var sb sandboxJSON
		if json.Unmarshal(ans.r.Body, &sb) == nil {
			b.track(sb.SandboxID, hdrTenant1)
		}
		t.Logf("the create on A finished before the kill: %s", ans.r)
	default:
		t.Logf("the create on A answered before the kill: %s", ans.r)
	}
	t.Logf("slots of t1:p1 at the kill: %v; B lists: %s", slotsAfterKill, describe(b.listAll(t, hdrTenant1).Sandboxes))

	// One lease plus two reconcile intervals after the kill.
	time.Sleep(time.Until(killedAt.Add(k.lease + 2*k.reconcile)))
	q, l := b.quotaAndHolders(t, hdrTenant1)
	h := slotHolders(l)
	t.Logf("%s after the kill, replica B: in_use %d of %d; listed: %s", time.Since(killedAt).Round(time.Millisecond), q.InUse, q.Limit, describe(l.Sandboxes))
	if q.InUse != len(h) {
		t.Errorf("%s after the kill (one lease of %s plus two reconcile intervals): got in_use %d on replica B, want %d, "+
			"the sandboxes B lists as CREATING, STARTING or RUNNING (%s)", time.Since(killedAt).Round(time.Millisecond),
			k.lease, q.InUse, len(h), describe(h))
	}

	// What A left half done is finished by B's reconciler once A's lock has lapsed.
	inFlight := func(l listJSON) bool {
		for _, sb := range l.Sandboxes {
			switch sb.State {
			case "CREATING", "STARTING", "STOPPING", "DESTROYING":
				return true
			}
		}
		return false
	}
	// A's lock lapses within one lease; B's reconciler then finishes what A left.
	eventually(t, 2*k.lease+6*k.reconcile, "every sandbox A left settles within about one lease", func() (bool, string) {
		l = b.listAll(t, hdrTenant1)
		return !inFlight(l), describe(l.Sandboxes)
	})
	q, l = b.quotaAndHolders(t, hdrTenant1)
	h = slotHolders(l)
	t.Logf("%s after the kill, settled: in_use %d; listed: %s", time.Since(killedAt).Round(time.Millisecond), q.InUse, describe(l.Sandboxes))
	if q.InUse != len(h) {
		t.Errorf("after what A left settled: got in_use %d on replica B, want %d, its listed holders (%s)", q.InUse, len(h), describe(h))
	}
	for _, sb := range l.Sandboxes {
		b.track(sb.SandboxID, hdrTenant1)
		r := b.curl(t, http.MethodDelete, prefix+"/"+sb.SandboxID, nil, hdrTenant1)
		if r.Status != http.StatusOK {
			t.Errorf("destroying %s (%s) that A left: %s: got status %d, want 200", sb.SandboxID, sb.State, r, r.Status)
		}
	}
	if q := b.quota(t, hdrTenant1); q.InUse != 0 {
		t.Errorf("after destroying what A left: got in_use %d, want 0", q.InUse)
	}
	// The project's one slot is free: B can create.
	id := b.create(t, createBody, hdrTenant1).SandboxID
	if q := b.quota(t, hdrTenant1); q != (quotaJSON{Limit: k.limit, InUse: 1}) {
		t.Errorf("after a create on B: got quota %+v, want in_use 1 of %d", q, k.limit)
	}
	b.curl(t, http.MethodDelete, prefix+"/"+id, nil, hdrTenant1).want(t, http.StatusOK)
	if q := b.quota(t, hdrTenant1); q.InUse != 0 {
		t.Errorf("after destroying it: got in_use %d, want 0", q.InUse)
	}
}

// TestQuotaFlushAll: creates and destroys run concurrently against a limit of 5 while the test
// FLUSHALLs the real redis-server several times. No sample ever sees more than 5 sandboxes
// listed as CREATING, STARTING or RUNNING, nor in_use (or the slots' ZCARD) above 5; at the end
// in_use equals the listed holders.
func TestQuotaFlushAll(t *testing.T) {
	requireComponents(t)
	const limit, workers = 5, 7
	const load, flushEvery = 20 * time.Second, 2500 * time.Millisecond
	rs := redistest.Start(t)
	s := startServer(t, serverOptions{RedisURL: rs.URL, Extra: quotaConfig(limit, 0, 500)})

	sampling, stopSampling := context.WithCancel(context.Background())
	defer stopSampling()
	var swg sync.WaitGroup
	listed, inUse, zcard := &gauge{}, &gauge{}, &gauge{}
	listed.run(sampling, &swg, 20*time.Millisecond, func(context.Context) (int, string, error) {
		l, err := s.readList(hdrTenant1)
		h := slotHolders(l)
		return len(h), describe(h), err
	})
	inUse.run(sampling, &swg, 5*time.Millisecond, inUseGauge(s))
	zcard.run(sampling, &swg, 2*time.Millisecond, zcardGauge(rs))

	var mu sync.Mutex
	var created, full, destroyed int
	var unexpected []string
	note := func(f string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		unexpected = append(unexpected, fmt.Sprintf(f, args...))
	}
	ctx, stop := context.WithTimeout(context.Background(), load)
	defer stop()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 4))
			pause := func(lo, hi int) { time.Sleep(time.Duration(lo+rng.IntN(hi-lo)) * time.Millisecond) }
			for ctx.Err() == nil {
				r, err := s.send(http.MethodPost, prefix, strings.NewReader(createBody), hdrJSON, hdrTenant1)
				if err != nil {
					note("create: %v", err)
					pause(200, 400)
					continue
				}
				switch r.Status {
				case http.StatusCreated:
					var sb sandboxJSON
					if err := json.Unmarshal(r.Body, &sb); err != nil || sb.SandboxID == "" {
						note("%s: undecodable (%v)", r, err)
						continue
					}
					s.track(sb.SandboxID, hdrTenant1)
					mu.Lock()
					created++
					mu.Unlock()
					pause(200, 1200)
					d, err := s.send(http.MethodDelete, prefix+"/"+sb.SandboxID, nil, hdrTenant1)
					switch {
					case err != nil:
						note("destroy: %v", err)
					case d.Status != http.StatusOK:
						note("%s: got status %d, want 200", d, d.Status)
					default:
						mu.Lock()
						destroyed++
						mu.Unlock()
					}
				case http.StatusTooManyRequests:
					if p := quotaExceededProblem(r, limit); p != "" {
						note("%s", p)
					}
					mu.Lock()
					full++
					mu.Unlock()
					pause(100, 300)
				default:
					note("%s: got status %d, want 201 or 429", r, r.Status)
					pause(200, 400)
				}
			}
		}()
	}
	flushes := 0
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(flushEvery):
			if err := rs.Client.FlushAll(context.Background()).Err(); err != nil {
				t.Errorf("FLUSHALL: %v", err)
			} else {
				flushes++
			}
		}
	}
	wg.Wait()

	// Everything has answered: in_use and the listed holders agree (the reconciler may need a
	// pass to settle leases after the last flush).
	var q quotaJSON
	var l listJSON
	deadline := time.Now().Add(15 * time.Second)
	for {
		q, l = s.quotaAndHolders(t, hdrTenant1)
		if q.InUse == len(slotHolders(l)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	stopSampling()
	swg.Wait()
	t.Logf("FLUSHALL under load: %d flushes in %s; %d creates answered 201, %d answered 429, %d destroyed", flushes, load, created, full, destroyed)
	if h := slotHolders(l); q.InUse != len(h) {
		t.Errorf("at the end: got in_use %d, want %d, the listed holders (%s)", q.InUse, len(h), describe(h))
	}
	listed.check(t, "sandboxes listed as CREATING, STARTING or RUNNING", limit)
	inUse.check(t, "GET "+prefix+"/quota in_use", limit)
	zcard.check(t, "ZCARD "+slotsKeyT1, limit)
	for i, u := range unexpected {
		if i == 5 {
			t.Errorf("… and %d more unexpected answers", len(unexpected)-5)
			break
		}
		t.Errorf("unexpected answer under FLUSHALL: %s", u)
	}
	if flushes < 3 {
		t.Errorf("got %d FLUSHALLs, want several", flushes)
	}
	if created < limit {
		t.Errorf("got %d creates answered 201 in %s, want at least %d (the load did not reach the limit)", created, load, limit)
	}
	// Nothing left holds a slot once every sandbox is destroyed.
	for _, sb := range l.Sandboxes {
		r := s.curl(t, http.MethodDelete, prefix+"/"+sb.SandboxID, nil, hdrTenant1)
		if r.Status != http.StatusOK && r.Status != http.StatusNotFound {
			t.Errorf("%s: got status %d, want 200", r, r.Status)
		}
	}
	if q := s.quota(t, hdrTenant1); q.InUse != 0 {
		t.Errorf("after destroying every sandbox: got in_use %d, want 0", q.InUse)
	}
}

// TestQuotaGraphQL: the quota query answers limit and use; createSandbox on a full project is
// an error with extensions.code QUOTA_EXCEEDED and extensions.retryAfter. The default limit here
// comes from the environment (SANDBOX_CONCURRENCY_LIMIT=1 over the config file's 0).
func TestQuotaGraphQL(t *testing.T) {
	requireComponents(t)
	rs := redistest.Start(t)
	s := startServer(t, serverOptions{RedisURL: rs.URL, Env: []string{"SANDBOX_CONCURRENCY_LIMIT=1"}})
	const gqlQuota = `{ quota { limit inUse } }`
	type gqlQuotaJSON struct {
		Limit int `json:"limit"`
		InUse int `json:"inUse"`
	}
	quota := func(key string) gqlQuotaJSON {
		t.Helper()
		var q gqlQuotaJSON
		s.gql(t, gqlQuota, nil, key).ok(t, "quota", &q)
		return q
	}
	if q := quota(hdrTenant1); q != (gqlQuotaJSON{Limit: 1}) {
		t.Fatalf("quota of an empty project: got %+v, want limit 1 (SANDBOX_CONCURRENCY_LIMIT), inUse 0", q)
	}
	id := s.create(t, createBody, hdrTenant1).SandboxID
	if q := quota(hdrTenant1); q != (gqlQuotaJSON{Limit: 1, InUse: 1}) {
		t.Errorf("quota with one RUNNING sandbox: got %+v, want limit 1, inUse 1", q)
	}
	if q := s.quota(t, hdrTenant1); q != (quotaJSON{Limit: 1, InUse: 1}) {
		t.Errorf("REST quota with one RUNNING sandbox: got %+v, want limit 1, in_use 1", q)
	}
	if q := quota(hdrTenant2); q != (gqlQuotaJSON{Limit: 1}) {
		t.Errorf("quota of another tenant: got %+v, want limit 1, inUse 0", q)
	}

	t.Run("createSandbox-full", func(t *testing.T) {
		g := s.gql(t, gqlCreate, map[string]any{"in": map[string]any{"profile": "sandboxes-default"}}, hdrTenant1)
		if raw, ok := g.Data["createSandbox"]; ok && string(raw) != "null" {
			var made gqlSandbox
			if json.Unmarshal(raw, &made) == nil && made.ID != "" {
				s.track(made.ID, hdrTenant1)
			}
			t.Fatalf("%s: got a sandbox, want QUOTA_EXCEEDED", g)
		}
		g.wantCode(t, 0, "QUOTA_EXCEEDED")
		if len(g.Errors) > 0 {
			ra, ok := g.Errors[0].Extensions["retryAfter"].(float64)
			if !ok || ra <= 0 || ra != float64(int(ra)) {
				t.Errorf("%s: got extensions.retryAfter %v, want a positive whole number of seconds", g, g.Errors[0].Extensions["retryAfter"])
			}
		}
	})
	t.Run("rest-create-full", func(t *testing.T) {
		r := s.curl(t, http.MethodPost, prefix, []byte(createBody), hdrJSON, hdrTenant1)
		if p := quotaExceededProblem(r, 1); p != "" {
			t.Error(p)
		}
	})
	t.Run("autostopAt-expiresAt", func(t *testing.T) {
		var sb struct {
			State      string     `json:"state"`
			CreatedAt  time.Time  `json:"createdAt"`
			TTLSec     int        `json:"ttlSec"`
			ExpiresAt  *time.Time `json:"expiresAt"`
			AutostopAt *time.Time `json:"autostopAt"`
		}
		s.gql(t, `query($id: ID!) { sandbox(id: $id) { state createdAt ttlSec expiresAt autostopAt } }`,
			map[string]any{"id": id}, hdrTenant1).ok(t, "sandbox", &sb)
		if sb.State != "RUNNING" || sb.AutostopAt == nil {
			t.Errorf("got state %s autostopAt %v, want a RUNNING sandbox's autostopAt", sb.State, sb.AutostopAt)
		}
		if want := sb.CreatedAt.Add(time.Duration(sb.TTLSec) * time.Second); sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(want) {
			t.Errorf("got expiresAt %v, want createdAt + ttlSec = %s", sb.ExpiresAt, want)
		}
	})
	var res struct {
		Sandbox struct {
			State string `json:"state"`
		} `json:"sandbox"`
	}
	s.gql(t, gqlDestroy, map[string]any{"id": id}, hdrTenant1).ok(t, "destroySandbox", &res)
	if q := quota(hdrTenant1); q != (gqlQuotaJSON{Limit: 1}) {
		t.Errorf("quota after destroySandbox: got %+v, want limit 1, inUse 0", q)
	}
}
