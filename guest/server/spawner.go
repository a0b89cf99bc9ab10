package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// spawner is the spawner program (guest/spawner/spawner.c): a small process of PID 1's, with
// no signal handlers, that starts the execs' processes. A child forked from Go must reset
// every signal handler Go installed before it may run anything (it shares the parent's memory
// until execve): some sixty system calls per command, each a trap into gVisor's kernel, and
// the largest part of starting a command. The program's children go straight to execve.
//
// It starts each process with CLONE_PARENT, so the process is PID 1's own child: the reaper
// waits for it like for any other. Its cgroup: the child writes "0" (itself) into the exec
// cgroup's tasks file (a descriptor PID 1 opens and passes for that one start) before
// anything else. It is used only where PID 1 reaps (Options.Reap) and only once started
// (Server.Warm); everything it cannot take (a start it cannot express, a program that died or
// went quiet) falls back to Go's own fork, or fails that one start where a process may
// already have been started.
type spawner struct {
	log *slog.Logger

	mu  sync.Mutex
	fd  int // our end of the socket pair; -1 once broken or closed
	pid int
	buf []byte
	// starts counts the processes it started.
	starts uint64
	exit   <-chan syscall.WaitStatus // the program's own wait status, from the reaper
	done   chan struct{}             // closed once the program's status arrived
	// ended is called once the program ended other than by close (killed, or given up).
	ended   func()
	closing bool
}

// The request layout (spawner.c's struct header, then NUL-terminated strings: the path, the
// working directory, the arguments, the environment), its flags, and its answer.
const (
	spawnMagic      = 0x53425831
	spawnSetpgid    = 1
	spawnSetsid     = 2
	spawnCgroup     = 4
	spawnMaxRequest = 128 << 10 // spawner.c's MAX_REQUEST; a larger start goes through Go
	spawnMaxStrings = 16384
	spawnAnswerSize = 12
	// spawnStepCgroup is the step (spawner.c's STEP_CGROUP) of a child that could not enter
	// its exec's cgroup; a failure of any other step reads as Go's fork reports it.
	spawnStepCgroup = 1
)

// spawnTimeout bounds the wait for an answer: the program answers once the child called
// execve, which takes milliseconds; only a stopped program (a command's SIGSTOP) waits this
// long. A variable for the tests.
var spawnTimeout = 10 * time.Second

// errNoSpawner says the spawner cannot take this start and nothing was started: Go's fork
// starts it instead.
var errNoSpawner = errors.New("guest: the spawner program cannot take this start")

// startSpawner starts the spawner program at path through fork (a function that starts a
// process the way the server wants it placed) and registers its wait with r.
func startSpawner(log *slog.Logger, path string, r *reaper, place func(fork func() (*os.Process, error)) (*os.Process, error), devNull *os.File, ended func()) (*spawner, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("guest: spawner: socket pair: %w", err)
	}
	theirs := os.NewFile(uintptr(fds[1]), "spawner")
	fork := func() (*os.Process, error) {
		return place(func() (*os.Process, error) {
			return os.StartProcess(path, []string{"sandbox-spawn"}, &os.ProcAttr{
				Dir:   "/",
				Env:   []string{},
				Files: []*os.File{devNull, devNull, devNull, theirs},
				// Out of PID 1's session and process group: nothing that signals one of
				// those reaches the program by the way.
				Sys: &syscall.SysProcAttr{Setsid: true},
			})
		})
	}
	pid, exit, err := r.start(fork)
	_ = theirs.Close()
	if err != nil {
		_ = unix.Close(fds[0])
		return nil, fmt.Errorf("guest: spawner: starting %s: %w", path, err)
	}
	tv := unix.NsecToTimeval(spawnTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fds[0], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		_ = unix.Close(fds[0])
		_ = syscall.Kill(pid, syscall.SIGKILL)
		return nil, fmt.Errorf("guest: spawner: receive timeout: %w", err)
	}
	sp := &spawner{log: log, fd: fds[0], pid: pid, exit: exit, done: make(chan struct{}), ended: ended}
	go sp.watch()
	return sp, nil
}

// watch waits for the program's end: from then on every start goes through Go's fork, and
// ended is told, unless close ended it.
func (sp *spawner) watch() {
	ws := <-sp.exit
	close(sp.done)
	sp.mu.Lock()
	if sp.fd >= 0 {
		code, sig := exitStatus(ws)
		sp.log.Warn("the spawner program ended; PID 1 starts the commands itself until it is replaced",
			"pid", sp.pid, "exit_code", code, "signal", sig)
		_ = unix.Close(sp.fd)
		sp.fd = -1
	}
	closing := sp.closing
	sp.mu.Unlock()
	if !closing && sp.ended != nil {
		sp.ended()
	}
}

// warm has the program start a process that cannot run (unrunnable), which pays the
// program's first clone.
func (sp *spawner) warm(devNull *os.File) error {
	none, err := unrunnable()
	if err != nil {
		none = "/proc/self/exe/.warm"
	}
	files := []*os.File{devNull, devNull, devNull}
	_, err = sp.start(nil, "", none, []string{none}, &os.ProcAttr{Dir: "/", Files: files})
	if err == nil || !ranNothing(err) {
		return fmt.Errorf("guest: spawner: a start that cannot run: got %v", err)
	}
	return nil
}

// state reports the program's pid while it serves (0 once it ended or failed) and how many
// processes it started.
func (sp *spawner) state() (pid int, starts uint64) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.fd >= 0 {
		pid = sp.pid
	}
	return pid, sp.starts
}

// breakLocked gives the program up after a failed exchange: it is killed (the reaper takes
// its status) and never used again.
func (sp *spawner) breakLocked(what string, err error) {
	sp.log.Warn("the spawner program failed; PID 1 starts the commands itself until it is replaced",
		"pid", sp.pid, "step", what, "err", err)
	_ = unix.Close(sp.fd)
	sp.fd = -1
	_ = syscall.Kill(sp.pid, syscall.SIGKILL)
}

// close ends the program (it exits when its socket closes) and waits for its status, at most
// a second before it kills it.
func (sp *spawner) close() {
	sp.mu.Lock()
	sp.closing = true
	if sp.fd >= 0 {
		_ = unix.Close(sp.fd)
		sp.fd = -1
	}
	sp.mu.Unlock()
	select {
	case <-sp.done:
		return
	case <-time.After(time.Second):
	}
	_ = syscall.Kill(sp.pid, syscall.SIGKILL)
	<-sp.done
}

// spawnRequest encodes a start into buf (reused): the flags from sys, errNoSpawner for what
// the program does not do.
func spawnRequest(buf []byte, argv0, dir string, argv, env []string, sys *syscall.SysProcAttr, cgroup bool) ([]byte, error) {
	var flags uint32
	if sys != nil {
		rest := *sys
		rest.Setpgid, rest.Setsid, rest.Setctty = false, false, false
		switch {
		case !reflect.DeepEqual(rest, syscall.SysProcAttr{}):
			return buf, errNoSpawner
		case sys.Setpgid && !sys.Setsid && !sys.Setctty:
			flags = spawnSetpgid
		case sys.Setsid && sys.Setctty && !sys.Setpgid: // Ctty 0: stdin, checked above
			flags = spawnSetsid
		case sys.Setpgid || sys.Setsid || sys.Setctty:
			return buf, errNoSpawner
		}
	}
	if cgroup {
		flags |= spawnCgroup
	}
	if argv0 == "" || dir == "" || len(argv) == 0 || len(argv)+len(env) > spawnMaxStrings {
		return buf, errNoSpawner
	}
	buf = binary.LittleEndian.AppendUint32(buf[:0], spawnMagic)
	buf = binary.LittleEndian.AppendUint32(buf, flags)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(argv)))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(env)))
	put := func(s string) bool {
		if strings.IndexByte(s, 0) >= 0 {
			return false // execve would cut it here: Go's fork reports EINVAL
		}
		buf = append(buf, s...)
		buf = append(buf, 0)
		return len(buf) <= spawnMaxRequest
	}
	if !put(argv0) || !put(dir) {
		return buf, errNoSpawner
	}
	for _, s := range argv {
		if !put(s) {
			return buf, errNoSpawner
		}
	}
	for _, s := range env {
		if !put(s) {
			return buf, errNoSpawner
		}
	}
	return buf, nil
}

// start asks the program to start argv0 with attr (its three files, Dir, Env and Sys), in
// cgroup name of cg when cg is not nil, and returns the child's pid. errNoSpawner: nothing was
// started. Any other error is the start's own (the program's errno, as os.StartProcess
// reports it), or the program's failure after the request went out, when a process may have
// been started: that start fails rather than risk starting the command twice.
func (sp *spawner) start(cg *Cgroups, name, argv0 string, argv []string, attr *os.ProcAttr) (int, error) {
	if len(attr.Files) != 3 {
		return 0, errNoSpawner
	}
	var fds [4]int
	for i, f := range attr.Files {
		if f == nil {
			return 0, errNoSpawner
		}
		fds[i] = int(f.Fd())
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.fd < 0 {
		return 0, errNoSpawner
	}
	req, err := spawnRequest(sp.buf, argv0, attr.Dir, argv, attr.Env, attr.Sys, cg != nil)
	sp.buf = req
	if err != nil {
		return 0, err
	}
	n := 3
	if cg != nil {
		tasks, err := cg.openTasks(name)
		if err != nil {
			return 0, fmt.Errorf("entering the exec's cgroup: %w", err)
		}
		defer unix.Close(tasks)
		fds[3] = tasks
		n = 4
	}
	if err := unix.Sendmsg(sp.fd, req, unix.UnixRights(fds[:n]...), nil, unix.MSG_NOSIGNAL); err != nil {
		// A message on a SOCK_SEQPACKET socket goes whole or not at all: nothing started.
		if !errors.Is(err, unix.EMSGSIZE) {
			// EMSGSIZE: larger than the socket carries here; the program is fine.
			sp.breakLocked("send", err)
		}
		return 0, errNoSpawner
	}
	var answer [spawnAnswerSize + 1]byte
	for {
		got, err := unix.Read(sp.fd, answer[:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err == nil && got != spawnAnswerSize {
			err = fmt.Errorf("an answer of %d bytes", got)
		}
		if err != nil {
			if errors.Is(err, unix.EAGAIN) {
				err = fmt.Errorf("no answer within %v", spawnTimeout)
			}
			sp.breakLocked("answer", err)
			return 0, fmt.Errorf("the spawner program failed while starting the command (%v); it may have started", err)
		}
		break
	}
	pid := int32(binary.LittleEndian.Uint32(answer[0:]))
	errno := int32(binary.LittleEndian.Uint32(answer[4:]))
	step := binary.LittleEndian.Uint32(answer[8:])
	switch {
	case pid > 0 && errno == 0:
		sp.starts++
		return int(pid), nil
	case pid >= 0 && errno > 0:
		// A child that could not run exited with 127: the reaper takes it, unregistered.
		if step == spawnStepCgroup {
			return 0, fmt.Errorf("entering the exec's cgroup: %w", syscall.Errno(errno))
		}
		return 0, &os.PathError{Op: "fork/exec", Path: argv0, Err: syscall.Errno(errno)}
	default:
		sp.breakLocked("answer", fmt.Errorf("pid %d, errno %d", pid, errno))
		return 0, fmt.Errorf("the spawner program answered pid %d, errno %d", pid, errno)
	}
}
