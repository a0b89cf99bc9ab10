package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// gqlEventsSubscription is a project-wide sandboxEvents subscription.
var gqlEventsSubscription = json.RawMessage(`{"query":"subscription { sandboxEvents { cursor type sandboxId state } }"}`)

// metricsText is the server's /metrics exposition.
func (c *client) metricsText(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /metrics: HTTP %d", resp.StatusCode)
	}
	return string(body), nil
}

// goroutines reads go_goroutines from the server's /metrics.
func (c *client) goroutines(ctx context.Context) (float64, error) {
	text, err := c.metricsText(ctx)
	if err != nil {
		return 0, err
	}
	v, ok := metricValue(text, "go_goroutines")
	if !ok {
		return 0, fmt.Errorf("GET /metrics: no go_goroutines")
	}
	return v, nil
}

// idleSub is one WebSocket connection of the subscriptions suite and what its reader saw.
type idleSub struct {
	ws                   *wsConn
	next, complete, errs atomic.Int32
	// ended is closed when the reader stops (the connection closed).
	ended chan struct{}
}

// readLoop answers pings and counts the messages of the connection until it fails or closes.
func (s *idleSub) readLoop(ctx context.Context) {
	defer close(s.ended)
	for {
		_, data, err := s.ws.c.Read(ctx)
		if err != nil {
			return
		}
		var m wsMsg
		if json.Unmarshal(data, &m) != nil {
			continue
		}
		switch m.Type {
		case "ping":
			_ = s.ws.write(ctx, wsMsg{Type: "pong"})
		case "next":
			s.next.Add(1)
		case "complete":
			s.complete.Add(1)
		case "error":
			s.errs.Add(1)
		}
	}
}

// forEach runs f(i) for i in [0, n) on workers goroutines and returns the first error.
func forEach(ctx context.Context, n, workers int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64
		once     sync.Once
		firstErr error
		wg       sync.WaitGroup
	)
	for range min(workers, n) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(ctx, i); err != nil {
					once.Do(func() { firstErr = err })
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return firstErr
}

// subSet is a set of WebSocket connections of the subscriptions suite, each with its reader.
type subSet struct {
	api     *client
	subs    []*idleSub
	ctx     context.Context
	cancel  context.CancelFunc
	readers sync.WaitGroup
}

func newSubSet(ctx context.Context, api *client) *subSet {
	s := &subSet{api: api}
	s.ctx, s.cancel = context.WithCancel(ctx)
	return s
}

// open dials n connections 16 at a time (each authenticated in connection_init and
// acknowledged), starts their readers and, when dial is not nil, records each one's time.
func (s *subSet) open(ctx context.Context, n int, dial *Result) error {
	start := len(s.subs)
	s.subs = append(s.subs, make([]*idleSub, n)...)
	var mu sync.Mutex
	return forEach(ctx, n, 16, func(ctx context.Context, i int) error {
		t0 := time.Now()
		ws, err := s.api.dialWS(ctx)
		d := time.Since(t0)
		if err != nil {
			return fmt.Errorf("connection %d: %w", start+i+1, err)
		}
		sub := &idleSub{ws: ws, ended: make(chan struct{})}
		s.subs[start+i] = sub
		s.readers.Go(func() { sub.readLoop(s.ctx) })
		if dial != nil {
			mu.Lock()
			dial.add(d)
			mu.Unlock()
		}
		return nil
	})
}

// subscribe sends one sandboxEvents subscription on every connection.
func (s *subSet) subscribe(ctx context.Context) error {
	return forEach(ctx, len(s.subs), 16, func(ctx context.Context, i int) error {
		_, err := s.subs[i].ws.subscribe(ctx, gqlEventsSubscription)
		return err
	})
}

// closeAll closes every connection (a normal closure, 16 at a time) and waits for the readers.
func (s *subSet) closeAll() {
	_ = forEach(context.Background(), len(s.subs), 16, func(_ context.Context, i int) error {
		if s.subs[i] != nil {
			s.subs[i].ws.close()
		}
		return nil
	})
	s.cancel()
	s.readers.Wait()
}

// serverState is sandboxd's RSS (0 when unknown) and goroutine count at one moment.
type serverState struct {
	rss        uint64
	goroutines float64
}

// settledGoroutines polls go_goroutines every 500 ms until three readings in a row are equal
// (or timeout has passed) and returns the last one.
func (c *client) settledGoroutines(ctx context.Context, timeout time.Duration) (float64, error) {
	deadline := time.Now().Add(timeout)
	var last []float64
	for {
		v, err := c.goroutines(ctx)
		if err != nil {
			return 0, err
		}
		last = append(last, v)
		if n := len(last); n >= 3 && last[n-1] == last[n-2] && last[n-2] == last[n-3] || time.Now().After(deadline) {
			return v, nil
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

func (b *bench) serverState(ctx context.Context) (serverState, error) {
	var st serverState
	var err error
	if pid := b.sandboxdPid(); pid != 0 {
		if st.rss, err = settledRSS(ctx, pid, 5); err != nil {
			return st, err
		}
	}
	st.goroutines, err = b.api.goroutines(ctx)
	return st, err
}

// benchSubscriptions: M idle sandboxEvents subscriptions over graphql-transport-ws, one per
// connection: sandboxd's RSS and goroutines per 1,000, next to the same connections without a
// subscription; whether they are still alive; a REST read while they are open; and whether
// the goroutines return to the baseline after they are closed.
func benchSubscriptions(ctx context.Context, b *bench) (groups []*Group, err error) {
	m := max(b.opts.subs, 1)
	per := 1000 / float64(m) // scales a total to "per 1,000"
	name := fmtRate(float64(m), "") + " idle subscriptions"
	mem := &Group{Name: name + ": sandboxd RSS per 1,000"}
	gor := &Group{Name: name + ": sandboxd goroutines each"}
	closed := &Group{Name: name + ": all closed"}
	conn := &Group{Name: name + ": connect"}
	probe := &Group{Name: name + ": REST list while open"}
	whole := &Group{Name: name + ": sandboxd RSS with all open"}
	groups = []*Group{mem, whole, gor, closed, conn, probe}
	// Issue 17 bounds 10,000 idle subscriptions at 1 GiB of server memory.
	rssAll := whole.valueResult("VmRSS, all open (bound 1024 MiB at 10,000)", "MiB", false)
	rssGrowth := whole.valueResult("growth over the baseline", "MiB", false)
	rssSub := mem.valueResult("connection + subscription", "MiB", false)
	rssConn := mem.valueResult("connection only (connection_init, no subscribe)", "MiB", true)
	gorSub := gor.valueResult("connection + subscription", "goroutines", false)
	gorConn := gor.valueResult("connection only (connection_init, no subscribe)", "goroutines", true)
	gorEnd := closed.valueResult("go_goroutines − baseline", "goroutines", false)
	dial := conn.result("WebSocket dial + connection_init → ack", false)
	probeOpen := probe.result("REST GET list, all open", false)
	probeNone := probe.result("REST GET list, none open", true)
	pid := b.sandboxdPid()
	if pid == 0 {
		rssSub.Skipped, rssConn.Skipped = "sandboxd not started by the benchmark", "sandboxd not started by the benchmark"
		rssAll.Skipped, rssGrowth.Skipped = rssSub.Skipped, rssSub.Skipped
	}
	const (
		probes       = 20
		probeTimeout = 5 * time.Second
		// maxProbeErrs failed probes end the probing (each may take probeTimeout).
		maxProbeErrs = 3
	)
	listOp := func(ctx context.Context) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		return timed(func() error { return b.api.do(ctx, http.MethodGet, restPrefix, nil, nil) })
	}

	// Warm-up: the server's WebSocket and subscription paths once, then the baseline.
	var set *subSet
	defer func() {
		if set != nil {
			set.closeAll()
		}
	}()
	progress("subscriptions: warm-up (10 subscriptions)")
	set = newSubSet(ctx, b.api)
	if err := set.open(ctx, 10, nil); err != nil {
		return groups, err
	}
	if err := set.subscribe(ctx); err != nil {
		return groups, err
	}
	if err := sleepCtx(ctx, time.Second); err != nil {
		return groups, err
	}
	set.closeAll()
	set = nil
	// A closed subscription's Redis reader ends only when its blocking XREAD returns (it
	// blocks 5 s): wait that long, then until the goroutine count holds still.
	if err := sleepCtx(ctx, 6*time.Second); err != nil {
		return groups, err
	}
	if _, err := b.api.settledGoroutines(ctx, 30*time.Second); err != nil {
		return groups, err
	}
	for range probes {
		d, err := listOp(ctx)
		if err != nil {
			return groups, err
		}
		probeNone.add(d)
	}
	base, err := b.serverState(ctx)
	if err != nil {
		return groups, err
	}
	progress("subscriptions: baseline RSS %.1f MiB, %v goroutines", float64(base.rss)/mib, base.goroutines)

	// The connections alone.
	t0 := time.Now()
	set = newSubSet(ctx, b.api)
	if err := set.open(ctx, m, dial); err != nil {
		return groups, err
	}
	progress("subscriptions: %d connections acknowledged in %s", m, fmtDuration(time.Since(t0)))
	if err := sleepCtx(ctx, 3*time.Second); err != nil {
		return groups, err
	}
	conns, err := b.serverState(ctx)
	if err != nil {
		return groups, err
	}
	// Then a subscription on each.
	t0 = time.Now()
	if err := set.subscribe(ctx); err != nil {
		return groups, err
	}
	progress("subscriptions: %d subscribed in %s; idle for %v", m, fmtDuration(time.Since(t0)), b.opts.subsWait)
	if err := sleepCtx(ctx, b.opts.subsWait); err != nil {
		return groups, err
	}
	withSubs, err := b.serverState(ctx)
	if err != nil {
		return groups, err
	}
	ended := 0
	for _, s := range set.subs {
		if s.complete.Load()+s.errs.Load() > 0 {
			ended++
		}
	}
	var probeErrs int
	var firstProbeErr error
	for range probes {
		d, err := listOp(ctx)
		if err != nil {
			probeErrs++
			if firstProbeErr == nil {
				firstProbeErr = err
			}
			if probeErrs >= maxProbeErrs {
				break
			}
			continue
		}
		probeOpen.add(d)
	}
	if probeErrs > 0 {
		probeOpen.Skipped = fmt.Sprintf("%d of %d calls failed", probeErrs, probeErrs+len(probeOpen.Samples))
	}
	if pid != 0 {
		rssConn.addValue((float64(conns.rss) - float64(base.rss)) / mib * per)
		rssSub.addValue((float64(withSubs.rss) - float64(base.rss)) / mib * per)
		rssAll.addValue(float64(withSubs.rss) / mib)
		rssGrowth.addValue((float64(withSubs.rss) - float64(base.rss)) / mib)
	}
	gorConn.addValue((conns.goroutines - base.goroutines) / float64(m))
	gorSub.addValue((withSubs.goroutines - base.goroutines) / float64(m))
	progress("subscriptions: RSS %.1f → %.1f (connections) → %.1f MiB (subscriptions); goroutines %v → %v → %v; %d ended early",
		float64(base.rss)/mib, float64(conns.rss)/mib, float64(withSubs.rss)/mib, base.goroutines, conns.goroutines, withSubs.goroutines, ended)

	// Are they alive? A new sandbox publishes events to every project-wide subscription. Only
	// tried when the server still answers REST calls.
	live := fmt.Sprintf("Not checked whether they still deliver events: REST calls failed while they were open (%v)", firstProbeErr)
	if len(probeOpen.Samples) > 0 {
		live = b.subscriptionsAlive(ctx, set)
	}
	progress("subscriptions: %s", live)

	// Close them all and watch the goroutines come back.
	t0 = time.Now()
	set.closeAll()
	set = nil
	closeTook := time.Since(t0)
	t0 = time.Now()
	var end float64
	for {
		if end, err = b.api.goroutines(ctx); err != nil {
			return groups, err
		}
		if end <= base.goroutines+5 || time.Since(t0) > 30*time.Second {
			break
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return groups, err
		}
	}
	backIn := time.Since(t0)
	gorEnd.addValue(end - base.goroutines)
	var rssEnd uint64
	if pid != 0 {
		rssEnd, _ = procRSS(pid)
	}
	progress("subscriptions: closed in %s; go_goroutines %v (baseline %v) %s later; RSS %.1f MiB",
		fmtDuration(closeTook), end, base.goroutines, fmtDuration(backIn), float64(rssEnd)/mib)

	mem.Note = fmt.Sprintf("%s WebSocket connections (graphql-transport-ws, github.com/coder/websocket), ONE subscription per connection: "+
		"`subscription { sandboxEvents { cursor type sandboxId state } }` (project-wide), opened 16 at a time; each connection has a "+
		"reader goroutine in the benchmark that answers pings. sandboxd: RSS (VmRSS, median of 5 readings) and go_goroutines (/metrics) "+
		"at baseline (after a warm-up of 10 subscriptions, closed 6 s or more before) %.1f MiB / %v; with the connections acknowledged (3 s later) "+
		"%.1f MiB / %v; %v after subscribing on each %.1f MiB / %v. Growths are one measurement each, scaled to 1,000 (ratio: "+
		"with the subscriptions over the connections alone). %d of %s subscriptions had ended (complete or error) by then. %s. "+
		"Closing all took %s; go_goroutines then %v against the baseline %v (polled until within 5 of it, at most 30 s: %s); RSS after "+
		"closing %.1f MiB. With the embedded Redis, go_goroutines counts its goroutines too (two per pooled connection; the client keeps "+
		"idle connections, at most 10 per CPU).",
		fmtRate(float64(m), ""), float64(base.rss)/mib, base.goroutines, float64(conns.rss)/mib, conns.goroutines, b.opts.subsWait, float64(withSubs.rss)/mib,
		withSubs.goroutines, ended, fmtRate(float64(m), ""), live, fmtDuration(closeTook), end, base.goroutines, fmtDuration(backIn), float64(rssEnd)/mib)
	probe.Note = fmt.Sprintf("up to %d serial REST GET list calls (each given %v, ending after %d failures) before the connections were "+
		"opened (bare) and after the %v idle wait with all %s subscriptions open", probes, probeTimeout, maxProbeErrs, b.opts.subsWait, fmtRate(float64(m), ""))
	if probeErrs > 0 {
		probe.Note += fmt.Sprintf("; %d failed with them open, the first: %v", probeErrs, firstProbeErr)
	}
	probe.Note += "."
	return groups, nil
}

// subscriptionsAlive creates a sandbox (every project-wide subscription gets its events),
// counts the subscriptions of set that receive an event within 30 s, and destroys it. A create
// that fails on the client's side may still complete on the server's: the sandboxes that
// appear in the project meanwhile are then destroyed, when the benchmark started the server
// (on a server of its own it made them all).
func (b *bench) subscriptionsAlive(ctx context.Context, set *subSet) string {
	before := make([]int32, len(set.subs))
	for i, s := range set.subs {
		before[i] = s.next.Load()
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t0 := time.Now()
	id, _, err := b.createSandbox(cctx)
	took := time.Since(t0)
	var live string
	if err != nil {
		live = fmt.Sprintf("Creating a sandbox while they were open (to see them deliver its events) failed after %s: %v", fmtDuration(took), err)
		if b.server != nil {
			b.destroyStrays(ctx)
		}
	} else {
		deadline := time.Now().Add(30 * time.Second)
		got := 0
		for {
			got = 0
			for i, s := range set.subs {
				if s.next.Load() > before[i] {
					got++
				}
			}
			if got == len(set.subs) || time.Now().After(deadline) || ctx.Err() != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		live = fmt.Sprintf("A sandbox created while they were open (the create took %s): %d of %d subscriptions received its events within %s of the create's answer",
			fmtDuration(took), got, len(set.subs), fmtDuration(time.Since(t0)-took))
	}
	if id != "" {
		var derr error
		b.finishSandbox(id, &derr)
		if derr != nil {
			live += fmt.Sprintf("; destroying it failed: %v", derr)
		}
	}
	return live
}

// destroyStrays tracks, after a create that failed on the client's side, the sandboxes of the
// project the benchmark does not know yet (it made them, on a server it started itself), so
// that they are destroyed with the others. They are looked for until the server answers (at
// most 2 minutes).
func (b *bench) destroyStrays(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for ctx.Err() == nil {
		var page struct {
			Sandboxes []sandboxJSON `json:"sandboxes"`
		}
		if err := b.api.do(ctx, http.MethodGet, restPrefix+"?limit=500", nil, &page); err != nil {
			_ = sleepCtx(ctx, time.Second)
			continue
		}
		for _, sb := range page.Sandboxes {
			b.mu.Lock()
			known := b.sandboxes[sb.ID]
			b.mu.Unlock()
			if !known && sb.State != "DESTROYED" && sb.State != "EXPIRED" {
				progress("subscriptions: %s (%s) was made by a create that timed out: destroyed at the end", sb.ID, sb.State)
				b.track(sb.ID)
			}
		}
		return
	}
}
