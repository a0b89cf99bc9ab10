package guest

import (
	"bytes"
	"errors"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// waiter starts processes and reports each one's wait status exactly once.
type waiter interface {
	// start starts a process; its status arrives on the returned channel (buffered).
	start(argv0 string, argv []string, attr *os.ProcAttr) (int, <-chan syscall.WaitStatus, error)
	// stop releases the waiter; every process it started must have been reported.
	stop()
}

// waitEach waits for every process with its own Wait (when the server is not PID 1).
type waitEach struct{}

func (waitEach) start(argv0 string, argv []string, attr *os.ProcAttr) (int, <-chan syscall.WaitStatus, error) {
	p, err := os.StartProcess(argv0, argv, attr)
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

func (r *reaper) start(argv0 string, argv []string, attr *os.ProcAttr) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, err := os.StartProcess(argv0, argv, attr)
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiting[p.Pid] = ch
	pid := p.Pid
	_ = p.Release() // the loop waits for it by pid; drop the pidfd
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

// killTree sends sig to the whole process tree of an exec: its process group (while the exec
// runs: after it ended the group id may no longer be ours) and every live process whose
// environment carries SBX_EXEC_ID=<id> (those that setsid'd or changed their group). For
// SIGKILL it repeats briefly until a scan finds nobody left.
func killTree(id string, pgid int, sig syscall.Signal) {
	delay := time.Millisecond
	for round := 0; ; round++ {
		if pgid > 0 {
			_ = syscall.Kill(-pgid, sig)
		}
		pids := findTree(id, pgid)
		for _, pid := range pids {
			_ = syscall.Kill(pid, sig)
		}
		if sig != syscall.SIGKILL || len(pids) == 0 || round >= 60 {
			return
		}
		time.Sleep(delay)
		delay = min(2*delay, 20*time.Millisecond)
	}
}

// findTree lists the live processes (zombies excluded) that belong to an exec: members of
// process group pgid (when pgid > 0) and carriers of SBX_EXEC_ID=<id> in /proc/<pid>/environ.
func findTree(id string, pgid int) []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	_ = d.Close()
	want := []byte(ExecIDEnv + "=" + id)
	self := os.Getpid()
	var pids []int
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid == self || pid <= 1 {
			continue
		}
		stat, err := os.ReadFile("/proc/" + name + "/stat")
		if err != nil {
			continue
		}
		state, pgrp, ok := parseStat(stat)
		if !ok || state == 'Z' || state == 'X' || state == 'x' {
			continue
		}
		if pgid > 0 && pgrp == pgid {
			pids = append(pids, pid)
			continue
		}
		env, err := os.ReadFile("/proc/" + name + "/environ")
		if err != nil {
			continue
		}
		if hasEnvEntry(env, want) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// parseStat reads the state and process group out of /proc/<pid>/stat.
func parseStat(stat []byte) (state byte, pgrp int, ok bool) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := bytes.Fields(stat[i+1:])
	if len(f) < 3 || len(f[0]) != 1 {
		return 0, 0, false
	}
	pgrp, err := strconv.Atoi(string(f[2]))
	if err != nil {
		return 0, 0, false
	}
	return f[0][0], pgrp, true
}

// hasEnvEntry reports whether a NUL-separated environment block holds exactly entry.
func hasEnvEntry(env, entry []byte) bool {
	for len(env) > 0 {
		i := bytes.IndexByte(env, 0)
		var e []byte
		if i < 0 {
			e, env = env, nil
		} else {
			e, env = env[:i], env[i+1:]
		}
		if bytes.Equal(e, entry) {
			return true
		}
	}
	return false
}
