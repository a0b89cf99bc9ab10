package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// What the memory rows read of /proc: the processes of a sandbox (found by its id in their
// command lines, plus their descendants), their address spaces, and each address space's
// proportional set size.

// kbField returns the value in bytes of a "Name:   123 kB" line of a /proc file (status,
// smaps_rollup).
func kbField(data []byte, name string) (uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != name+":" {
			continue
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %w", name, sc.Text(), err)
		}
		if len(f) >= 3 && f[2] != "kB" {
			return 0, fmt.Errorf("%s: unknown unit in %q", name, sc.Text())
		}
		return v << 10, nil
	}
	return 0, fmt.Errorf("no %s line", name)
}

// pssOf is the Pss of a /proc/<pid>/smaps_rollup, in bytes.
func pssOf(smapsRollup []byte) (uint64, error) { return kbField(smapsRollup, "Pss") }

// rssOf is the VmRSS of a /proc/<pid>/status, in bytes.
func rssOf(status []byte) (uint64, error) { return kbField(status, "VmRSS") }

// procRSS reads the VmRSS of pid.
func procRSS(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return rssOf(data)
}

// metricValue returns the value of an unlabelled sample of a Prometheus text exposition
// ("go_goroutines 42").
func metricValue(text, name string) (float64, bool) {
	for line := range strings.SplitSeq(text, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			return v, err == nil
		}
	}
	return 0, false
}

// proc is one host process.
type proc struct {
	pid, ppid int
	args      []string
	threads   int
}

// isIDByte reports whether c may be part of a sandbox id.
func isIDByte(c byte) bool {
	return c == '_' || c == '-' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// mentions reports whether id appears in one of args as a whole word: not inside a longer id
// (a path component "/boxes/<id>/bundle" or the container id argument counts).
func mentions(args []string, id string) bool {
	if id == "" {
		return false
	}
	for _, a := range args {
		for i := 0; ; {
			j := strings.Index(a[i:], id)
			if j < 0 {
				break
			}
			start, end := i+j, i+j+len(id)
			if (start == 0 || !isIDByte(a[start-1])) && (end == len(a) || !isIDByte(a[end])) {
				return true
			}
			i = start + 1
		}
	}
	return false
}

// boxProcs returns the pids of the processes that mention id in their command line and of
// all their descendants (sentry stubs and such have no command line of their own), sorted.
func boxProcs(procs []proc, id string) []int {
	children := map[int][]int{}
	for _, p := range procs {
		children[p.ppid] = append(children[p.ppid], p.pid)
	}
	seen := map[int]bool{}
	var walk func(pid int)
	walk = func(pid int) {
		if seen[pid] {
			return
		}
		seen[pid] = true
		for _, c := range children[pid] {
			walk(c)
		}
	}
	for _, p := range procs {
		if mentions(p.args, id) {
			walk(p.pid)
		}
	}
	out := make([]int, 0, len(seen))
	for pid := range seen {
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}

// rootOf is the process among pids whose parent is not among them, following pid up.
func rootOf(byPid map[int]proc, pids map[int]bool, pid int) int {
	for {
		p, ok := byPid[pid]
		if !ok || !pids[p.ppid] {
			return pid
		}
		pid = p.ppid
	}
}

// groupBy partitions pids into classes of same (an equivalence), keeping the order of first
// appearance.
func groupBy(pids []int, same func(a, b int) (bool, error)) ([][]int, error) {
	var classes [][]int
next:
	for _, pid := range pids {
		for i, c := range classes {
			ok, err := same(c[0], pid)
			if err != nil {
				return nil, err
			}
			if ok {
				classes[i] = append(classes[i], pid)
				continue next
			}
		}
		classes = append(classes, []int{pid})
	}
	return classes, nil
}

// listProcs reads every process of /proc (processes that vanish meanwhile are left out).
func listProcs() ([]proc, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		status, err := os.ReadFile(filepath.Join(dir, "status"))
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil {
			continue
		}
		p := proc{pid: pid, args: strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")}
		for line := range strings.SplitSeq(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "PPid:"); ok {
				p.ppid, _ = strconv.Atoi(strings.TrimSpace(v))
			}
			if v, ok := strings.CutPrefix(line, "Threads:"); ok {
				p.threads, _ = strconv.Atoi(strings.TrimSpace(v))
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// sameMM reports whether two processes share one address space (gVisor's systrap stubs are
// processes cloned with CLONE_VM: summing their smaps would count one address space several
// times). kcmp(2) compares them; without it (ENOSYS) identical smaps_rollup contents count
// as the same address space.
func sameMM(a, b int) (bool, error) {
	if a == b {
		return true, nil
	}
	const kcmpVM = 1 // KCMP_VM of linux/kcmp.h (x/sys/unix does not define it)
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(a), uintptr(b), kcmpVM, 0, 0, 0)
	switch {
	case errno == 0:
		return r == 0, nil
	case errno == unix.ESRCH:
		return false, nil // one of them is gone: its memory no longer counts
	case errno == unix.ENOSYS || errno == unix.EPERM:
		ra, err1 := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", a))
		rb, err2 := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", b))
		if err := errors.Join(err1, err2); err != nil {
			return false, nil
		}
		return bytes.Equal(ra, rb), nil
	default:
		return false, fmt.Errorf("kcmp(%d, %d, KCMP_VM): %w", a, b, errno)
	}
}

// boxMemory is what one sandbox's host processes use.
type boxMemory struct {
	// PSS sums the Pss of each address space once; Sentry is the part of the runsc-sandbox
	// process and its descendants, Gofer of runsc-gofer's.
	PSS, Sentry, Gofer uint64
	Procs, Threads     int
	AddressSpaces      int
}

// measureBox finds the processes of sandbox id in procs and sums their PSS, each address
// space once.
func measureBox(procs []proc, id string) (boxMemory, error) {
	pids := boxProcs(procs, id)
	if len(pids) == 0 {
		return boxMemory{}, fmt.Errorf("no process mentions %s in its command line (is the sandbox on this host?)", id)
	}
	byPid := map[int]proc{}
	for _, p := range procs {
		byPid[p.pid] = p
	}
	in := map[int]bool{}
	for _, pid := range pids {
		in[pid] = true
	}
	classes, err := groupBy(pids, sameMM)
	if err != nil {
		return boxMemory{}, err
	}
	m := boxMemory{Procs: len(pids)}
	for _, pid := range pids {
		m.Threads += byPid[pid].threads
	}
	for _, c := range classes {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", c[0]))
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			continue
		}
		if err != nil {
			return m, err
		}
		pss, err := pssOf(data)
		if err != nil {
			// A kernel thread or a zombie has no mappings.
			continue
		}
		m.AddressSpaces++
		m.PSS += pss
		root := byPid[rootOf(byPid, in, c[0])]
		switch {
		case len(root.args) > 0 && strings.Contains(root.args[0], "gofer") || slices.Contains(root.args, "gofer"):
			m.Gofer += pss
		default:
			m.Sentry += pss
		}
	}
	return m, nil
}
