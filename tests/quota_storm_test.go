package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

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
	e2e.RequireComponents(t)
	t.Run("one-replica", func(t *testing.T) {
		rs := redistest.Start(t)
		s := e2e.StartServer(t, e2e.ServerOptions{RedisURL: rs.URL, Extra: quotaConfig(10, 0, 0)})
		storm(t, rs, []*e2e.Server{s})
	})
	t.Run("two-replicas", func(t *testing.T) {
		rs := redistest.Start(t)
		storm(t, rs, e2e.ReplicasWith(t, e2e.ServerOptions{RedisURL: rs.URL, Extra: quotaConfig(10, 0, 0)}, 2))
	})
}

type stormResult struct {
	server  *e2e.Server
	resp    *e2e.Response
	err     error
	latency time.Duration
}

func storm(t *testing.T, rs *redistest.Server, servers []*e2e.Server) {
	const limit, clients, perClient = 10, 20, 10
	if q := servers[0].Quota(t, e2e.HdrTenant1); q != (e2e.QuotaJSON{Limit: limit}) {
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
				r, err := srv.SendVia(context.Background(), hc, http.MethodPost, e2e.Prefix, strings.NewReader(e2e.CreateBody), e2e.HdrJSON, e2e.HdrTenant1)
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
		server *e2e.Server
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
			var sb e2e.SandboxJSON
			if err := json.Unmarshal(res.resp.Body, &sb); err != nil || sb.SandboxID == "" {
				unexpected = append(unexpected, fmt.Sprintf("%s: undecodable (%v)", res.resp, err))
				continue
			}
			res.server.Track(sb.SandboxID, e2e.HdrTenant1)
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
	inUse.check(t, "GET "+e2e.Prefix+"/quota in_use", limit)

	q, l := quotaAndHolders(t, servers[0], e2e.HdrTenant1)
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
			r, err := srv.Send(http.MethodDelete, e2e.Prefix+"/"+m.id, nil, e2e.HdrTenant1)
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
		if q := srv.Quota(t, e2e.HdrTenant1); q != (e2e.QuotaJSON{Limit: limit}) {
			t.Errorf("quota after destroying all on %s: got %+v, want in_use 0 of %d", srv.URL, q, limit)
		}
	}
	if n, err := rs.Client.ZCard(context.Background(), slotsKeyT1).Result(); err != nil || n != 0 {
		t.Errorf("ZCARD %s after destroying all: got %d (%v), want 0", slotsKeyT1, n, err)
	}
}
