package main

import (
	"context"
	"fmt"
	"slices"
	"time"
)

const mib = 1 << 20

// sandboxdPid is the pid of the sandboxd this run started (0 when it targets --url).
func (b *bench) sandboxdPid() int {
	if b.server == nil || b.server.cmd == nil || b.server.cmd.Process == nil {
		return 0
	}
	return b.server.cmd.Process.Pid
}

// settledRSS samples pid's VmRSS n times 200 ms apart and returns the median.
func settledRSS(ctx context.Context, pid, n int) (uint64, error) {
	var s []uint64
	for i := range n {
		if i > 0 {
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
		v, err := procRSS(pid)
		if err != nil {
			return 0, fmt.Errorf("sandboxd RSS: %w", err)
		}
		s = append(s, v)
	}
	slices.Sort(s)
	return s[len(s)/2], nil
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// benchMemory: K idle sandboxes made through REST; the host memory their runsc processes use
// (PSS, each address space once) and sandboxd's RSS growth, per sandbox.
func benchMemory(ctx context.Context, b *bench) (groups []*Group, err error) {
	k := max(b.opts.memoryK, 1)
	g := &Group{Name: fmt.Sprintf("memory per idle sandbox (%d idle)", k)}
	groups = []*Group{g}
	pssRes := g.valueResult("runsc processes' PSS, per sandbox", "MiB", false)
	rssRes := g.valueResult("sandboxd RSS growth, per sandbox", "MiB", false)
	pid := b.sandboxdPid()
	if pid == 0 {
		rssRes.Skipped = "sandboxd not started by the benchmark"
	}

	// One sandbox made and destroyed first, so that sandboxd's first-use allocations are in
	// the baseline rather than in the first sandbox's share.
	progress("memory: a warm-up sandbox")
	warm, _, err := b.createSandbox(ctx)
	b.finishSandbox(warm, &err)
	if err != nil {
		return groups, fmt.Errorf("warm-up sandbox: %w", err)
	}
	var base uint64
	if pid != 0 {
		if err := sleepCtx(ctx, 2*time.Second); err != nil {
			return groups, err
		}
		if base, err = settledRSS(ctx, pid, 5); err != nil {
			return groups, err
		}
	}
	ids := make([]string, 0, k)
	defer func() {
		for _, id := range ids {
			b.finishSandbox(id, &err)
		}
	}()
	for i := range k {
		id, d, err := b.createSandbox(ctx)
		if id != "" {
			ids = append(ids, id)
		}
		if err != nil {
			return groups, fmt.Errorf("creating idle sandbox %d of %d: %w", i+1, k, err)
		}
		progress("memory: created %s (%d/%d) in %s", id, i+1, k, fmtDuration(d))
	}
	progress("memory: letting %d idle sandboxes settle for %v", k, b.opts.memorySettle)
	if err := sleepCtx(ctx, b.opts.memorySettle); err != nil {
		return groups, err
	}
	var after uint64
	if pid != 0 {
		if after, err = settledRSS(ctx, pid, 5); err != nil {
			return groups, err
		}
	}
	procs, err := listProcs()
	if err != nil {
		return groups, err
	}
	var total boxMemory
	for _, id := range ids {
		m, err := measureBox(procs, id)
		if err != nil {
			return groups, err
		}
		pssRes.addValue(float64(m.PSS) / mib)
		total.PSS += m.PSS
		total.Sentry += m.Sentry
		total.Gofer += m.Gofer
		total.Procs += m.Procs
		total.Threads += m.Threads
		total.AddressSpaces += m.AddressSpaces
		progress("memory: %s: PSS %.1f MiB (sandbox %.1f, gofer %.1f), %d processes, %d threads, %d address spaces",
			id, float64(m.PSS)/mib, float64(m.Sentry)/mib, float64(m.Gofer)/mib, m.Procs, m.Threads, m.AddressSpaces)
	}
	growth := (float64(after) - float64(base)) / float64(k) / mib
	if pid != 0 {
		rssRes.addValue(growth)
		progress("memory: sandboxd RSS %.1f → %.1f MiB: %.2f MiB per sandbox", float64(base)/mib, float64(after)/mib, growth)
	}
	kf := float64(k)
	note := fmt.Sprintf("%d sandboxes of the default profile created through REST one after the other, idle (nothing run in them) "+
		"for %v, then measured; each row's samples are one per sandbox. PSS: the processes whose command line names the sandbox id "+
		"(runsc-sandbox, runsc-gofer) and all their descendants (the systrap stubs), each address space counted once "+
		"(stubs share one: kcmp KCMP_VM), from /proc/<pid>/smaps_rollup; sum/K %.1f MiB, of which the sandbox process and its "+
		"stubs %.1f MiB and the gofer %.1f MiB; %.0f processes, %.0f threads and %.0f address spaces per sandbox. Pages shared by "+
		"several sandboxes (the runsc binary) are split among all processes mapping them, so the share per sandbox shrinks as "+
		"more run. gvisor-notes measured 13–14 MiB idle PSS (~20 host tasks) for a bare `runsc` sandbox (a reference, not "+
		"compared). ",
		k, b.opts.memorySettle, float64(total.PSS)/kf/mib, float64(total.Sentry)/kf/mib, float64(total.Gofer)/kf/mib,
		float64(total.Procs)/kf, float64(total.Threads)/kf, float64(total.AddressSpaces)/kf)
	if pid != 0 {
		note += fmt.Sprintf("sandboxd RSS (VmRSS, median of 5 readings 200 ms apart) %.1f MiB after a warm-up sandbox was made and "+
			"destroyed, %.1f MiB with the %d idle: (after − before)/K, one measurement.", float64(base)/mib, float64(after)/mib, k)
	}
	g.Note = note
	return groups, nil
}
