package quota

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/redistest"
)

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
