package tests

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// cpuSampler notes, every cpuSampleEvery until stopped, the CPU time (user and system, its own,
// not its children's) of every process on the host: a bench's account of where a step's CPU
// went when everything (the test cluster's API server and node, the servers, the boxes)
// shares the host's cores. A process seen first after the start counts from zero; one that
// lived less than a period between two samples is missed.
type cpuSampler struct {
	stop chan struct{}
	done chan map[string]time.Duration
}

const cpuSampleEvery = 50 * time.Millisecond

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times (100 on Linux).
const clockTicks = 100

type procTicks struct {
	name        string
	first, last int64
}

func startCPUSampler() *cpuSampler {
	s := &cpuSampler{stop: make(chan struct{}), done: make(chan map[string]time.Duration, 1)}
	procs := map[int]*procTicks{}
	sample := func(initial bool) {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			name, ticks, ok := readProcTicks(e.Name())
			if !ok {
				continue
			}
			p := procs[pid]
			if p == nil {
				p = &procTicks{}
				if initial {
					p.first = ticks
				}
				procs[pid] = p
			}
			p.name, p.last = name, ticks
		}
	}
	sample(true)
	go func() {
		t := time.NewTicker(cpuSampleEvery)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				sample(false)
			case <-s.stop:
				sample(false)
				by := map[string]time.Duration{}
				for _, p := range procs {
					if d := p.last - p.first; d > 0 {
						by[p.name] += time.Duration(d) * time.Second / clockTicks
					}
				}
				s.done <- by
				return
			}
		}
	}()
	return s
}

// end stops the sampler and adds what it saw, by process name, into into.
func (s *cpuSampler) end(into map[string]time.Duration) {
	close(s.stop)
	for k, v := range <-s.done {
		into[k] += v
	}
}

// readProcTicks reads process pid's name and its own user and system time.
func readProcTicks(pid string) (string, int64, bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return "", 0, false // ended meanwhile
	}
	// pid (comm) state ...: utime and stime are fields 14 and 15; comm may hold spaces and
	// parentheses, so the fields are counted from its last ')'.
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", 0, false
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 13 {
		return "", 0, false
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	name := s[open+1 : end]
	if strings.HasPrefix(name, "kworker/") {
		name = "kworker" // its name follows the work it does
	}
	return name, u + st, true
}

// topCPU formats the n largest of by, each divided by per (the rounds), after their total.
func topCPU(by map[string]time.Duration, per, n int) string {
	type kv struct {
		name string
		d    time.Duration
	}
	var all []kv
	var total time.Duration
	for k, v := range by {
		all = append(all, kv{k, v / time.Duration(per)})
		total += v / time.Duration(per)
	}
	slices.SortFunc(all, func(a, b kv) int { return cmp.Compare(b.d, a.d) })
	parts := []string{fmt.Sprintf("%.2f CPU-s;", total.Seconds())}
	for _, e := range all[:min(n, len(all))] {
		parts = append(parts, fmt.Sprintf("%s %.2f", e.name, e.d.Seconds()))
	}
	return strings.Join(parts, " ")
}
