package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// loadResult is what one closed-loop load run measured.
type loadResult struct {
	// Latencies are the durations of every call that finished.
	Latencies []time.Duration
	// Elapsed is from the start until the last call finished (calls started before the
	// deadline run to their end).
	Elapsed time.Duration
}

// load runs clients goroutines that each call op back to back until d has passed (a closed
// loop: each client waits for its answer before the next call) and returns every call's
// latency. The first error stops all clients and is returned.
func load(ctx context.Context, clients int, d time.Duration, op func(ctx context.Context) error) (loadResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	lat := make([][]time.Duration, clients)
	start := time.Now()
	deadline := start.Add(d)
	for c := range clients {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(deadline) {
				t0 := time.Now()
				err := op(ctx)
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					cancel()
					return
				}
				lat[c] = append(lat[c], time.Since(t0))
			}
		})
	}
	wg.Wait()
	res := loadResult{Elapsed: time.Since(start)}
	for _, l := range lat {
		res.Latencies = append(res.Latencies, l...)
	}
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return res, firstErr
}

// rateStep is one path of a load comparison: op called by every client for a slice of time.
type rateStep struct {
	res *Result
	op  func(ctx context.Context) error
	// calls and elapsed accumulate over the recorded slices, for the result's rate.
	calls   int
	elapsed time.Duration
}

// interleaveLoad measures the steps with clients concurrent clients in rounds slices of
// slice each, alternating the steps slice by slice (the first one rotating round by round)
// after one unrecorded warm-up slice of each, and sets each result's latencies and rate
// (calls per second over the recorded slices).
func interleaveLoad(ctx context.Context, name string, clients, rounds int, slice, warmup time.Duration, steps []*rateStep) error {
	progress("%s: %d clients, %d × %v per path after a %v warm-up, %d paths", name, clients, rounds, slice, warmup, len(steps))
	for _, s := range steps {
		if warmup > 0 {
			if _, err := load(ctx, clients, warmup, s.op); err != nil {
				return fmt.Errorf("%s, %s (warm-up): %w", name, s.res.Label, err)
			}
		}
	}
	for round := range rounds {
		for k := range steps {
			s := steps[(round+k)%len(steps)]
			lr, err := load(ctx, clients, slice, s.op)
			if err != nil {
				return fmt.Errorf("%s, %s: %w", name, s.res.Label, err)
			}
			s.res.Samples = append(s.res.Samples, lr.Latencies...)
			s.calls += len(lr.Latencies)
			s.elapsed += lr.Elapsed
		}
	}
	var parts []string
	for _, s := range steps {
		if s.elapsed > 0 {
			s.res.Rate = float64(s.calls) / s.elapsed.Seconds()
		}
		parts = append(parts, fmt.Sprintf("%s %s, median %s", s.res.Label, fmtRate(s.res.Rate, s.res.RateUnit),
			fmtDuration(summarize(s.res.Samples).Median)))
	}
	progress("%s: %s", name, strings.Join(parts, "; "))
	return nil
}
