package main

import (
	"context"
	"time"
)

// benchNetwork: create → first exec `true` of a sandbox with network egress (its own network
// namespace, veth pair, addresses and nftables rules, runsc's netstack) next to one without
// network, the same profile otherwise, alternating round by round.
func benchNetwork(ctx context.Context, b *bench) (groups []*Group, err error) {
	g := &Group{Name: "create → first exec `true`: network egress vs none"}
	groups = []*Group{g}
	none := g.result("REST create (network none) + REST exec", true)
	egress := g.result("REST create (network egress) + REST exec", false)
	body := execBody([]string{"true"}, "")
	round := func(profile string) func(ctx context.Context) (time.Duration, error) {
		return func(ctx context.Context) (time.Duration, error) {
			return b.createThenRun(ctx, profile, body, nil)
		}
	}
	steps := []step{{none, round(benchProfile)}, {egress, round(benchEgressProfile)}}
	err = interleave(ctx, g.Name, min(b.opts.warmup, 1), b.opts.createN, steps)
	g.Note = "the same profile but for its network: none (runsc --network=none) against egress " +
		"(a network namespace, a veth pair and a /30, the policy's nftables chain, runsc --network=sandbox); " +
		"a new sandbox each round, destroyed outside the timed part (the egress teardown too)."
	return groups, err
}

// createThenRun is one timed round of create → first exec: a sandbox of profile through REST
// (tracked, and destroyed after the timed part), then body in it, wanting exit 0. created,
// when set, gets the create call's own duration when it succeeded.
func (b *bench) createThenRun(ctx context.Context, profile string, body []byte, created func(time.Duration)) (time.Duration, error) {
	var id string
	d, err := timed(func() error {
		var took time.Duration
		var err error
		if id, took, err = b.createTracked(ctx, profile); err != nil {
			return err
		}
		if created != nil {
			created(took)
		}
		res, err := b.api.exec(ctx, id, body)
		if err != nil {
			return err
		}
		return res.check("")
	})
	b.finishSandbox(id, &err)
	return d, err
}

// createTracked creates a sandbox of profile through REST, tracked for destruction even when
// the create failed half way, and returns its id and the create call's own duration.
func (b *bench) createTracked(ctx context.Context, profile string) (string, time.Duration, error) {
	t0 := time.Now()
	sb, err := b.api.createOf(ctx, profile, "")
	took := time.Since(t0)
	b.track(sb.ID)
	return sb.ID, took, err
}
