package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ---- where the CPU goes ----

// cpuTicks is the CPU time (user + system, with reaped children) of pid, in clock ticks.
func cpuTicks(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, data)
	}
	// After "pid (comm)": state is field 3; utime, stime, cutime, cstime are fields 14 to 17.
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 15 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, data)
	}
	var sum int64
	for _, s := range f[11:15] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %q", pid, data)
		}
		sum += v
	}
	return sum, nil
}

// clockTick is the length of a /proc clock tick (USER_HZ is 100 on every Linux ABI Go runs on).
const clockTick = 10 * time.Millisecond

// cpuSnap is the CPU time used so far by sandboxd, the sandbox's processes and the benchmark
// itself (with its reaped children: the bare runsc exec processes).
type cpuSnap struct{ sandboxd, redis, box, self time.Duration }

// cpuSources are where cpuSnapshot reads, each found once by a scan of /proc. A snapshot is
// taken right before and right after each timed run; a scan costs some 5 ms on a slow host,
// so a scan per snapshot put 10 ms of the benchmark's own work between two runs of a suite,
// long enough for a sandbox's threads to fall asleep: the next run then paid their wake-up,
// which the floor's spawns, back to back inside the sandbox, never pay.
type cpuSources struct {
	mu sync.Mutex
	// redis is the redis-server child of sandboxd pid redisOf (0: none found).
	redis, redisOf int
	// boxes holds each sandbox's cgroup CPU file, once found.
	boxes map[string]string
}

func (b *bench) cpuSnapshot(sandboxID string) cpuSnap {
	var s cpuSnap
	if pid := b.sandboxdPid(); pid != 0 {
		t, _ := cpuTicks(pid)
		s.sandboxd = time.Duration(t) * clockTick
		s.redis = b.redisCPU(pid)
	}
	s.box = b.boxCPU(sandboxID)
	var self, children syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &self) == nil && syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children) == nil {
		s.self = time.Duration(self.Utime.Nano() + self.Stime.Nano() + children.Utime.Nano() + children.Stime.Nano())
	}
	return s
}

// redisCPU is the CPU used so far by the embedded Redis of sandboxd pid (its redis-server
// child, with the AOF rewrites it reaped), found by a scan the first time and again whenever
// the one found has gone (sandboxd restarts a Redis that died).
func (b *bench) redisCPU(sandboxd int) time.Duration {
	b.cpu.mu.Lock()
	defer b.cpu.mu.Unlock()
	if b.cpu.redisOf == sandboxd && b.cpu.redis != 0 {
		if t, err := cpuTicks(b.cpu.redis); err == nil {
			return time.Duration(t) * clockTick
		}
	}
	b.cpu.redis, b.cpu.redisOf = 0, sandboxd
	procs, err := listProcs()
	if err != nil {
		return 0
	}
	for _, p := range procs {
		if p.ppid == sandboxd && len(p.args) > 0 && isRedisServer(p.args[0]) {
			b.cpu.redis = p.pid
			t, _ := cpuTicks(p.pid)
			return time.Duration(t) * clockTick
		}
	}
	return 0
}

// boxCPU is the CPU used so far by sandbox id's host processes: its cgroup's usage, one read,
// when the sandbox process has a cgroup of its own (runsc puts it, its gofer and the stubs of
// the sandbox's processes there; the usage also keeps what processes that exited used), else
// the sum of the /proc ticks of the processes that mention id and their descendants (a scan
// each time).
func (b *bench) boxCPU(id string) time.Duration {
	b.cpu.mu.Lock()
	file, found := b.cpu.boxes[id]
	b.cpu.mu.Unlock()
	if found {
		if d, err := cgroupCPU(file); err == nil {
			return d
		}
	}
	procs, err := listProcs()
	if err != nil {
		return 0
	}
	pids := boxProcs(procs, id)
	for _, p := range procs {
		if slices.Contains(pids, p.pid) && len(p.args) > 0 && filepath.Base(p.args[0]) == "runsc-sandbox" {
			if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", p.pid)); err == nil {
				if file, d := cgroupCPUFile(data); file != "" {
					b.cpu.mu.Lock()
					if b.cpu.boxes == nil {
						b.cpu.boxes = map[string]string{}
					}
					b.cpu.boxes[id] = file
					b.cpu.mu.Unlock()
					return d
				}
			}
			break
		}
	}
	var sum time.Duration
	for _, pid := range pids {
		if pid != os.Getpid() {
			t, _ := cpuTicks(pid)
			sum += time.Duration(t) * clockTick
		}
	}
	return sum
}

// boxCPUHow says how boxCPU reads sandbox id's CPU, for a report's notes.
func (b *bench) boxCPUHow(id string) string {
	b.cpu.mu.Lock()
	defer b.cpu.mu.Unlock()
	if b.cpu.boxes[id] != "" {
		return "its cgroup's usage"
	}
	return "/proc ticks of 10 ms"
}

// cgroupCPUFile is the file that holds the CPU usage of the cgroup named in data (a
// /proc/PID/cgroup), the first of cgroupCPUFiles that reads, with what it read; "" when none
// does.
func cgroupCPUFile(data []byte) (string, time.Duration) {
	for _, c := range cgroupCPUFiles(data) {
		if d, err := cgroupCPU(c); err == nil {
			return c, d
		}
	}
	return "", 0
}

// cgroupCPUFiles are where the CPU usage of the cgroup named in data may be: the cpuacct
// controller's cpuacct.usage on cgroup v1, cpu.stat in the unified hierarchy on v2; none for
// the root cgroup, which the whole host shares.
func cgroupCPUFiles(data []byte) []string {
	var v1, v2 string
	for line := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case slices.Contains(strings.Split(parts[1], ","), "cpuacct"):
			v1 = parts[2]
		}
	}
	var files []string
	if v1 != "" && v1 != "/" {
		for _, mnt := range []string{"cpuacct", "cpu,cpuacct", "cpuacct,cpu"} {
			files = append(files, filepath.Join("/sys/fs/cgroup", mnt, v1, "cpuacct.usage"))
		}
	}
	if v2 != "" && v2 != "/" {
		files = append(files, filepath.Join("/sys/fs/cgroup", v2, "cpu.stat"),
			filepath.Join("/sys/fs/cgroup/unified", v2, "cpu.stat"))
	}
	return files
}

// cgroupCPU reads a cgroup's CPU usage: cpuacct.usage (nanoseconds) or cpu.stat's usage_usec.
func cgroupCPU(file string) (time.Duration, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	return parseCgroupCPU(filepath.Base(file), data)
}

func parseCgroupCPU(name string, data []byte) (time.Duration, error) {
	if name == "cpu.stat" {
		for line := range strings.SplitSeq(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				us, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				if err != nil {
					return 0, fmt.Errorf("%s: usage_usec %q", name, v)
				}
				return time.Duration(us) * time.Microsecond, nil
			}
		}
		return 0, fmt.Errorf("%s: no usage_usec", name)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q", name, data)
	}
	return time.Duration(ns), nil
}
