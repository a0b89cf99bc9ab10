package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"
)

// benchWarmProfile is benchProfile with a warm pool (--warm-pool boxes): the warm suite's
// creates claim its boxes. The server gets it only when the warm suite runs.
const benchWarmProfile = "bench-warm"

// benchWarm: create → first exec `true` of a profile with a warm pool, next to the same of a
// profile without one (the same spec but for the pool), alternating round by round. Before
// each timed warm create the pool is full again (its ready gauge at the target and every box
// claimed so far replaced), so a round times a claim; misses are counted from the server's
// metrics, and the server's own claim time comes from its claim histogram. Each round then
// runs `true` a second time in the same sandbox (untimed in the main rows): the first and the
// second exec of a box side by side, each also as the guest init timed it (its duration_ms,
// from the command's start to its exit inside the sandbox), say where a first exec's extra
// time goes.
func benchWarm(ctx context.Context, b *bench) (groups []*Group, err error) {
	g := &Group{Name: "create → first exec `true`: warm pool vs cold"}
	groups = []*Group{g}
	cold := g.result("REST create (cold) + REST exec", true)
	warm := g.result("REST create (warm pool hit) + REST exec", false)
	warmParts := execParts{
		create:      g.reference("of which the REST create (warm pool hit)"),
		first:       g.reference("warm: first REST exec `true` in the box"),
		second:      g.reference("warm: second REST exec `true` in the box"),
		firstGuest:  g.reference("warm: first exec inside the box (guest duration_ms)"),
		secondGuest: g.reference("warm: second exec inside the box (guest duration_ms)"),
	}
	coldParts := execParts{
		first:       g.reference("cold: first REST exec `true` in the box"),
		second:      g.reference("cold: second REST exec `true` in the box"),
		firstGuest:  g.reference("cold: first exec inside the box (guest duration_ms)"),
		secondGuest: g.reference("cold: second exec inside the box (guest duration_ms)"),
	}
	if b.server == nil {
		cold.Skipped = "needs the server the benchmark starts (its warm profile)"
		warm.Skipped = cold.Skipped
		return groups, nil
	}
	target := b.opts.warmPool
	before, err := b.api.poolMetrics(ctx)
	if err != nil {
		return groups, err
	}
	body := execBody([]string{"true"}, "")
	round := func(profile string, waitFull bool, parts *execParts) func(ctx context.Context) (time.Duration, error) {
		return func(ctx context.Context) (time.Duration, error) {
			if waitFull {
				if err := b.api.waitPoolFull(ctx, target); err != nil {
					return 0, err
				}
			}
			return b.createThenRunTwice(ctx, profile, body, parts)
		}
	}
	steps := []step{{cold, round(benchProfile, false, &coldParts)}, {warm, round(benchWarmProfile, true, &warmParts)}}
	warmup := min(b.opts.warmup, 1)
	err = interleave(ctx, g.Name, warmup, b.opts.warmN, steps)
	warmParts.dropWarmup(warmup)
	coldParts.dropWarmup(warmup)
	after, merr := b.api.poolMetrics(ctx)
	if err == nil {
		err = merr
	}
	g.Note = fmt.Sprintf("profile %s keeps a warm pool of %d (per replica), %s the same spec without one; "+
		"each warm round waits (untimed) until the pool is full again, then times REST create + REST exec; "+
		"then a second exec in the same sandbox, outside the main rows; "+
		"a new sandbox each round, destroyed outside the timed part. The ratio is warm/cold (0.20x = 5x faster).",
		benchWarmProfile, target, benchProfile)
	if merr == nil {
		hits, misses := after.hits-before.hits, after.misses-before.misses
		g.Note += fmt.Sprintf(" p90: warm %s, cold %s. Claims in the run: %.0f hits, %.0f misses (warm-up included).",
			fmtDuration(p90(warm.Samples)), fmtDuration(p90(cold.Samples)), hits, misses)
		if n := after.claimCount - before.claimCount; n > 0 {
			g.Note += fmt.Sprintf(" Server side, a hit's create (checks to RUNNING, sandboxd_warm_pool_claim_duration_seconds): mean %s over %.0f.",
				fmtDuration(time.Duration((after.claimSum-before.claimSum)/n*float64(time.Second))), n)
		}
	}
	return groups, err
}

// execParts are the reference rows of one path of the warm suite: its create alone (nil: not
// recorded), its first and second exec as the client and as the guest init timed them.
type execParts struct {
	create, first, second, firstGuest, secondGuest *Result
}

// dropWarmup drops the samples of the warm-up rounds.
func (p *execParts) dropWarmup(n int) {
	for _, r := range []*Result{p.create, p.first, p.second, p.firstGuest, p.secondGuest} {
		if r != nil {
			r.Samples = r.Samples[min(n, len(r.Samples)):]
		}
	}
}

// createThenRunTwice times a create of profile and an exec of body in the new sandbox (what
// it returns), then runs body once more untimed in the returned figure; parts get the pieces.
// The sandbox is destroyed afterwards (untimed).
func (b *bench) createThenRunTwice(ctx context.Context, profile string, body []byte, parts *execParts) (d time.Duration, err error) {
	var id string
	defer func() { b.finishSandbox(id, &err) }()
	var first time.Duration
	var res execResult
	d, err = timed(func() error {
		var took time.Duration
		if id, took, err = b.createTracked(ctx, profile); err != nil {
			return err
		}
		if parts.create != nil {
			parts.create.add(took)
		}
		t1 := time.Now()
		res, err = b.api.exec(ctx, id, body)
		first = time.Since(t1)
		if err != nil {
			return err
		}
		return res.check("")
	})
	if err != nil {
		return d, err
	}
	parts.first.add(first)
	parts.firstGuest.add(time.Duration(res.DurationMs) * time.Millisecond)
	t2 := time.Now()
	res, err = b.api.exec(ctx, id, body)
	second := time.Since(t2)
	if err == nil {
		err = res.check("")
	}
	if err != nil {
		return d, fmt.Errorf("second exec: %w", err)
	}
	parts.second.add(second)
	parts.secondGuest.add(time.Duration(res.DurationMs) * time.Millisecond)
	return d, nil
}

// p90 is the nearest-rank 90th percentile of samples.
func p90(samples []time.Duration) time.Duration {
	s := slices.Clone(samples)
	slices.Sort(s)
	return percentile(s, 90)
}

// poolFigures are the warm profile's pool metrics at one moment.
type poolFigures struct {
	ready, hits, misses, fills float64
	claimSum, claimCount       float64
}

// poolMetrics reads the warm profile's pool figures from the server's /metrics.
func (c *client) poolMetrics(ctx context.Context) (poolFigures, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/metrics", nil)
	if err != nil {
		return poolFigures{}, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return poolFigures{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return poolFigures{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return poolFigures{}, fmt.Errorf("GET /metrics: HTTP %d", resp.StatusCode)
	}
	text := string(data)
	p := `profile="` + benchWarmProfile + `"`
	var f poolFigures
	f.ready, _ = metricValue(text, `sandboxd_warm_pool_boxes{`+p+`,state="ready"}`)
	f.hits, _ = metricValue(text, `sandboxd_warm_pool_claims_total{`+p+`,result="hit"}`)
	f.misses, _ = metricValue(text, `sandboxd_warm_pool_claims_total{`+p+`,result="miss"}`)
	f.fills, _ = metricValue(text, `sandboxd_warm_pool_fill_duration_seconds_count{outcome="ok",`+p+`}`)
	f.claimSum, _ = metricValue(text, `sandboxd_warm_pool_claim_duration_seconds_sum{`+p+`}`)
	f.claimCount, _ = metricValue(text, `sandboxd_warm_pool_claim_duration_seconds_count{`+p+`}`)
	return f, nil
}

// waitPoolFull waits until the warm profile's pool holds target ready boxes and every box
// claimed so far has been replaced (the gauge alone may still count a box just claimed).
func (c *client) waitPoolFull(ctx context.Context, target int) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		f, err := c.poolMetrics(ctx)
		if err != nil {
			return err
		}
		if int(f.ready) >= target && f.fills-f.hits >= float64(target) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the warm pool did not refill within 2 minutes (ready %.0f of %d, %.0f fills, %.0f hits)",
				f.ready, target, f.fills, f.hits)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
