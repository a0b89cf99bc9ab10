package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
)

// rssBound is issue 17's bound on the server's memory after a whole run on the embedded
// defaults: sandboxd with its embedded Redis.
const rssBound = 300

// serverMemory is the last group of a run on a server the benchmark started: the resident
// memory sandboxd and its embedded redis-server hold after every selected suite ran, and what
// the Go heap and Redis's own accounting say of it (/metrics).
func serverMemory(ctx context.Context, b *bench, ran []string) *Group {
	g := &Group{Name: "server memory after the run"}
	sbx := g.valueResult("sandboxd RSS", "MiB", false)
	rds := g.valueResult("embedded redis-server RSS", "MiB", false)
	sum := g.valueResult(fmt.Sprintf("sandboxd + redis-server (bound %d MiB)", rssBound), "MiB", false)
	pid := b.sandboxdPid()
	if pid == 0 {
		sbx.Skipped, rds.Skipped, sum.Skipped = "sandboxd not started by the benchmark", "sandboxd not started by the benchmark", "sandboxd not started by the benchmark"
		return g
	}
	s, err := settledRSS(ctx, pid, 5)
	if err != nil {
		sbx.Skipped, rds.Skipped, sum.Skipped = err.Error(), err.Error(), err.Error()
		return g
	}
	sbx.addValue(float64(s) / mib)
	total := s
	rpid, err := childNamed(pid, "redis-server")
	var r uint64
	if err == nil {
		r, err = settledRSS(ctx, rpid, 5)
	}
	if err != nil {
		rds.Skipped = err.Error()
		sum.Skipped = "no redis-server RSS: " + err.Error()
	} else {
		rds.addValue(float64(r) / mib)
		total += r
		sum.addValue(float64(total) / mib)
	}
	var heap, used string
	if text, err := b.api.metricsText(ctx); err == nil {
		if v, ok := metricValue(text, "go_memstats_heap_inuse_bytes"); ok {
			heap = fmt.Sprintf("%.1f MiB", v/mib)
		}
		// What the Go runtime holds besides the heap in use: idle heap not yet given back,
		// and everything it took from the OS.
		idle, ok1 := metricValue(text, "go_memstats_heap_idle_bytes")
		released, ok2 := metricValue(text, "go_memstats_heap_released_bytes")
		sys, ok3 := metricValue(text, "go_memstats_sys_bytes")
		if heap != "" && ok1 && ok2 && ok3 {
			heap += fmt.Sprintf(", idle heap not released %.1f MiB, taken from the OS %.1f MiB", (idle-released)/mib, sys/mib)
		}
		if v, ok := metricValue(text, "sandboxd_redis_used_memory_bytes"); ok {
			used = fmt.Sprintf("%.1f MiB", v/mib)
		}
	}
	g.Note = fmt.Sprintf("after the suites %s on the server the benchmark started (embedded defaults): VmRSS, median of 5 "+
		"readings 200 ms apart, of sandboxd (pid %d) and of the redis-server it runs (its child, pid %d); "+
		"Go heap in use %s (go_memstats_heap_inuse_bytes), Redis used_memory %s (sandboxd_redis_used_memory_bytes). "+
		"Issue 17 bounds the sum at %d MiB.", strings.Join(ran, ", "), pid, rpid, orUnknown(heap), orUnknown(used), rssBound)
	progress("server memory: sandboxd %.1f MiB, redis-server %.1f MiB, heap %s, Redis used %s",
		float64(s)/mib, float64(r)/mib, orUnknown(heap), orUnknown(used))
	return g
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// childNamed is the pid of parent's child process whose program is name (the base of its
// command line's first word: redis-server rewrites its title to "path address").
func childNamed(parent int, name string) (int, error) {
	procs, err := listProcs()
	if err != nil {
		return 0, err
	}
	for _, p := range procs {
		if p.ppid != parent || len(p.args) == 0 {
			continue
		}
		if f := strings.Fields(p.args[0]); len(f) > 0 && filepath.Base(f[0]) == name {
			return p.pid, nil
		}
	}
	return 0, fmt.Errorf("no %s child of pid %d", name, parent)
}
