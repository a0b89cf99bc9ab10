package main

import (
	"bufio"
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// memoryLimitShare is the part of the process's cgroup memory limit that Go's garbage
// collector is asked to keep the process under: the rest is room for what the collector does
// not count (goroutine stacks in flight, the embedded Redis is another process) before the
// kernel's OOM killer acts.
const memoryLimitShare = 0.9

// setMemoryLimit gives Go's garbage collector a soft limit (runtime/debug.SetMemoryLimit) of
// memoryLimitShare of the cgroup memory limit sandboxd runs under (a Kubernetes container's
// limits.memory), unless GOMEMLIMIT is set, which the runtime honours itself. Without a limit
// the heap of a replica with thousands of subscriptions grows with the garbage of one answer
// to each before a collection, past a container's limit. It returns the limit it set (0 for
// none).
func setMemoryLimit(getenv func(string) string, log *slog.Logger) int64 {
	if getenv("GOMEMLIMIT") != "" {
		return 0
	}
	max, ok := cgroupMemoryMax("/proc/self/cgroup", "/sys/fs/cgroup")
	if !ok {
		return 0
	}
	limit := int64(float64(max) * memoryLimitShare)
	debug.SetMemoryLimit(limit)
	log.Info("Go memory limit set from the cgroup's", "cgroup_memory_max", max, "go_memory_limit", limit)
	return limit
}

// cgroupMemoryMax reads the memory limit of the cgroup the process is in: cgroup v2's
// memory.max, or v1's memory.limit_in_bytes, under root. ok is false when there is none ("max",
// v1's huge "unlimited", or no such file).
func cgroupMemoryMax(procCgroup, root string) (max int64, ok bool) {
	b, err := os.ReadFile(procCgroup)
	if err != nil {
		return 0, false
	}
	var v2, v1 string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case strings.Contains(","+parts[1]+",", ",memory,"):
			v1 = parts[2]
		}
	}
	var file string
	switch {
	case v1 != "":
		file = filepath.Join(root, "memory", filepath.Clean("/"+v1), "memory.limit_in_bytes")
	case v2 != "":
		file = filepath.Join(root, filepath.Clean("/"+v2), "memory.max")
	default:
		return 0, false
	}
	b, err = os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	n, err := strconv.ParseInt(s, 10, 64)
	// v1 reports no limit as a page-rounded maximum of int64 (about 2^63).
	if err != nil || n <= 0 || n >= 1<<62 {
		return 0, false
	}
	return n, true
}
