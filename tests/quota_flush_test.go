package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

// TestQuotaFlushAll: creates and destroys run concurrently against a limit of 5 while the test
// FLUSHALLs the real redis-server several times. No sample ever sees more than 5 sandboxes
// listed as CREATING, STARTING or RUNNING, nor in_use (or the slots' ZCARD) above 5; at the end
// in_use equals the listed holders.
func TestQuotaFlushAll(t *testing.T) {
	e2e.RequireComponents(t)
	const limit, workers = 5, 7
	const load, flushEvery = 20 * time.Second, 2500 * time.Millisecond
	rs := redistest.Start(t)
	s := e2e.StartServer(t, e2e.ServerOptions{RedisURL: rs.URL, Extra: quotaConfig(limit, 0, 500)})

	sampling, stopSampling := context.WithCancel(context.Background())
	defer stopSampling()
	var swg sync.WaitGroup
	listed, inUse, zcard := &gauge{}, &gauge{}, &gauge{}
	listed.run(sampling, &swg, 20*time.Millisecond, func(context.Context) (int, string, error) {
		l, err := s.ReadList(e2e.HdrTenant1)
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
				r, err := s.Send(http.MethodPost, e2e.Prefix, strings.NewReader(e2e.CreateBody), e2e.HdrJSON, e2e.HdrTenant1)
				if err != nil {
					note("create: %v", err)
					pause(200, 400)
					continue
				}
				switch r.Status {
				case http.StatusCreated:
					var sb e2e.SandboxJSON
					if err := json.Unmarshal(r.Body, &sb); err != nil || sb.SandboxID == "" {
						note("%s: undecodable (%v)", r, err)
						continue
					}
					s.Track(sb.SandboxID, e2e.HdrTenant1)
					mu.Lock()
					created++
					mu.Unlock()
					pause(200, 1200)
					d, err := s.Send(http.MethodDelete, e2e.Prefix+"/"+sb.SandboxID, nil, e2e.HdrTenant1)
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
	var q e2e.QuotaJSON
	var l e2e.ListJSON
	deadline := time.Now().Add(15 * time.Second)
	for {
		q, l = quotaAndHolders(t, s, e2e.HdrTenant1)
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
	inUse.check(t, "GET "+e2e.Prefix+"/quota in_use", limit)
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
		r := s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+sb.SandboxID, nil, e2e.HdrTenant1)
		if r.Status != http.StatusOK && r.Status != http.StatusNotFound {
			t.Errorf("%s: got status %d, want 200", r, r.Status)
		}
	}
	if q := s.Quota(t, e2e.HdrTenant1); q.InUse != 0 {
		t.Errorf("after destroying every sandbox: got in_use %d, want 0", q.InUse)
	}
}
