package server

import (
	"bytes"
	"errors"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// waiter starts processes and reports each one's wait status exactly once.
type waiter interface {
	// start starts a process with fork (os.StartProcess, or a variant of it that places the
	// process); its status arrives on the returned channel (buffered).
	start(fork func() (*os.Process, error)) (int, <-chan syscall.WaitStatus, error)
	// stop releases the waiter; every process it started must have been reported.
	stop()
}

// waitEach waits for every process with its own Wait (when the server is not PID 1).
type waitEach struct{}

func (waitEach) start(fork func() (*os.Process, error)) (int, <-chan syscall.WaitStatus, error) {
	p, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	// Owned by the process: it ends when the process has been waited for, which the exec's
	// supervisor guarantees by killing the tree on timeout and on Close.
	go func() {
		st, err := p.Wait()
		if err != nil {
			ch <- syscall.WaitStatus(0x7f << 8) // cannot happen for our own child
			return
		}
		ch <- st.Sys().(syscall.WaitStatus)
	}()
	return p.Pid, ch, nil
}

func (waitEach) stop() {}

// reaper is the PID-1 strategy: one SIGCHLD loop calls wait4(-1, WNOHANG), hands each status
// to the exec registered under that pid and silently reaps every orphan that was re-parented
// to us. A process is started and registered under the lock the loop takes, so a child that
// exits at once cannot be reaped before its exec is registered (and syscall.ForkExec's own
// wait4 for a child that failed to exec cannot race with the loop).
type reaper struct {
	mu      sync.Mutex
	waiting map[int]chan syscall.WaitStatus

	sig       chan os.Signal
	quit      chan struct{}
	stopped   chan struct{}
	subreaper bool
}

func startReaper() *reaper {
	r := &reaper{
		waiting: make(map[int]chan syscall.WaitStatus),
		sig:     make(chan os.Signal, 1),
		quit:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
	signal.Notify(r.sig, syscall.SIGCHLD)
	if os.Getpid() != 1 {
		// Not PID 1 (a test, or a fake driver on the host): become a subreaper so that
		// orphaned grandchildren are re-parented to us and reaped here as well.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err == nil {
			r.subreaper = true
		}
	}
	go r.loop()
	return r
}

func (r *reaper) loop() {
	defer close(r.stopped)
	r.reap()
	for {
		select {
		case <-r.sig:
			r.reap()
		case <-r.quit:
			return
		}
	}
}

func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if ws.Stopped() || ws.Continued() {
			continue
		}
		if ch, ok := r.waiting[pid]; ok {
			delete(r.waiting, pid)
			ch <- ws
		}
	}
}

func (r *reaper) start(fork func() (*os.Process, error)) (int, <-chan syscall.WaitStatus, error) {
	return r.startPID(func() (int, error) {
		p, err := fork()
		if err != nil {
			return 0, err
		}
		pid := p.Pid
		_ = p.Release() // the loop waits for it by pid; drop the pidfd
		return pid, nil
	})
}

// startPID is start for a fork that gives a pid of our child (the spawner program's starts,
// made with CLONE_PARENT).
func (r *reaper) startPID(fork func() (int, error)) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiting[pid] = ch
	return pid, ch, nil
}

func (r *reaper) stop() {
	signal.Stop(r.sig)
	close(r.quit)
	<-r.stopped
	if r.subreaper {
		_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
	}
}

// exitStatus converts a wait status into the protocol's exit code and signal name.
func exitStatus(ws syscall.WaitStatus) (code int, sig string) {
	switch {
	case ws.Exited():
		return ws.ExitStatus(), ""
	case ws.Signaled():
		return 128 + int(ws.Signal()), unix.SignalName(ws.Signal())
	default:
		return 128, ""
	}
}

// signals are the signals a client may send to an exec's tree.
var signals = map[string]syscall.Signal{
	"SIGTERM": syscall.SIGTERM,
	"SIGKILL": syscall.SIGKILL,
	"SIGINT":  syscall.SIGINT,
	"SIGHUP":  syscall.SIGHUP,
	"SIGQUIT": syscall.SIGQUIT,
	"SIGUSR1": syscall.SIGUSR1,
	"SIGUSR2": syscall.SIGUSR2,
}

// killTree signals an exec's processes where the init has no cgroups (a server on a host, or a
// runtime that starts PID 1 without CAP_SYS_ADMIN): it tracks them by process group and
// parentage, as the kernel shows them in /proc at the moment of the kill. pgid is the exec's
// main process, which started as the leader of its own process group; running says it has
// not been reaped yet. For SIGKILL it repeats until a round finds nobody left (bounded).
//
// The exec's processes are then: while it runs, the main process, the members of its process
// group and every live descendant of those (through the PPid links); once the main process
// was reaped, the group's members and their live descendants, unless a process now holds the
// group's number as its pid (a pid is not reused while a group of that number exists, so
// such a process means the exec's group died out and the number went to someone else).
//
// What this fallback cannot catch, because nothing the init can observe ties such a process to
// its exec any more (cgroups can; see Cgroups):
//   - a process that left the process group (setsid, setpgid) and whose chain of parents back
//     to the group broke before the kill: a daemon that forked twice ((setsid cmd &),
//     daemon(3), `setsid cmd` run as the exec's main process) is re-parented to PID 1 (or to
//     the nearest subreaper) at once, and is then nobody's descendant;
//   - after the main process ended, its own children that left the group (they were
//     re-parented when it exited).
//
// And like any kill by a pid read from /proc, a signal can race with the reuse of that pid.
func killTree(pgid int, running bool, sig syscall.Signal) {
	if pgid <= 1 {
		return
	}
	self := os.Getpid()
	delay := time.Millisecond
	for round := 0; ; round++ {
		// Read the tree before signalling anyone: a process that dies re-parents its children
		// and breaks the links that tie them to the exec.
		tree := treeMembers(readProcs(), pgid, running, self)
		if running {
			// The whole group at once, forks of this very moment included. Its number is
			// ours while the main process is not reaped.
			_ = syscall.Kill(-pgid, sig)
		}
		for _, p := range tree {
			if running && p.pgrp == pgid {
				continue // signalled with the group: never twice
			}
			_ = syscall.Kill(p.pid, sig)
		}
		if sig != syscall.SIGKILL || len(tree) == 0 || round >= killRounds {
			return
		}
		time.Sleep(delay)
		delay = min(2*delay, 20*time.Millisecond)
	}
}

// procEntry is one process as /proc/<pid>/stat shows it.
type procEntry struct {
	pid, ppid, pgrp int
	zombie          bool
}

// treeMembers picks out of procs the live processes of the exec led by pgid (see killTree for
// the rules), never self or PID 1, ordered by pid.
func treeMembers(procs []procEntry, pgid int, running bool, self int) []procEntry {
	in := make(map[int]bool)
	if running {
		in[pgid] = true
	}
	children := make(map[int][]int)
	for _, p := range procs {
		if !running && p.pid == pgid {
			return nil // the group's number belongs to another process now
		}
		if p.pgrp == pgid {
			in[p.pid] = true
		}
		children[p.ppid] = append(children[p.ppid], p.pid)
	}
	queue := make([]int, 0, len(in))
	for pid := range in {
		queue = append(queue, pid)
	}
	for len(queue) > 0 {
		pid := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		for _, c := range children[pid] {
			if !in[c] {
				in[c] = true
				queue = append(queue, c)
			}
		}
	}
	var out []procEntry
	for _, p := range procs {
		if in[p.pid] && !p.zombie && p.pid > 1 && p.pid != self {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b procEntry) int { return a.pid - b.pid })
	return out
}

// readProcs reads every process's pid, parent, process group and state from /proc.
func readProcs() []procEntry {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	_ = d.Close()
	procs := make([]procEntry, 0, len(names))
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + name + "/stat")
		if err != nil {
			continue
		}
		state, ppid, pgrp, ok := parseStat(stat)
		if !ok {
			continue
		}
		procs = append(procs, procEntry{pid: pid, ppid: ppid, pgrp: pgrp,
			zombie: state == 'Z' || state == 'X' || state == 'x'})
	}
	return procs
}

// parseStat reads the state, parent and process group out of /proc/<pid>/stat.
func parseStat(stat []byte) (state byte, ppid, pgrp int, ok bool) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, 0, false
	}
	f := bytes.Fields(stat[i+1:])
	if len(f) < 3 || len(f[0]) != 1 {
		return 0, 0, 0, false
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	pgrp, err2 := strconv.Atoi(string(f[2]))
	if err1 != nil || err2 != nil {
		return 0, 0, 0, false
	}
	return f[0][0], ppid, pgrp, true
}
