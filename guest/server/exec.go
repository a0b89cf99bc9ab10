package server

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
	"time"

	"sandboxd/guest/proto"
)

// drainAfterExit is how long the pipes are read after the main process exited: a background
// process that inherited stdout must not hold the exec open.
const drainAfterExit = time.Second

var execIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// execState is one exec, owned by the server (not by the request that started it).
type execState struct {
	id      string
	argv    []string
	log     *execLog
	started time.Time
	// done is closed once the server is done with the exec (its exit recorded, its cgroup
	// given back when empty).
	done chan struct{}

	mu sync.Mutex
	// cg and cgroup are the exec's cgroup (see Cgroups); cg is nil where the init has none,
	// and its processes are then tracked by process group and parentage (killTree).
	// cgroupGone: the exec ended with its cgroup empty and gave it up (dropEmptyCgroup): it
	// may be another exec's now, so nothing of this one's signals it or removes it.
	cg         *Cgroups
	cgroup     string
	cgroupGone bool
	pid        int
	reaped     bool // the main process was waited for: its pid may be reused
	timedOut   bool
	// in feeds the command's stdin (nil: /dev/null); term is its terminal (nil: pipes).
	// Both are set once, before startExec answers.
	in   *stdinFeed
	term *terminal
}

func (e *execState) info() proto.ExecInfo {
	size, exit := e.log.status()
	e.mu.Lock()
	pid, in, term := e.pid, e.in, e.term
	e.mu.Unlock()
	info := proto.ExecInfo{
		ID:        e.id,
		Argv:      e.argv,
		Pid:       pid,
		StartedAt: e.started,
		Running:   exit == nil,
		LogBytes:  size,
		Exit:      exit,
		StdinOpen: in != nil && in.writable(),
	}
	if term != nil {
		sz := term.currentSize()
		info.Tty = &sz
	}
	return info
}

// kill signals every process the exec started that is still alive, whether the exec runs or
// ended: the processes of its cgroup, or without cgroups what killTree finds.
func (e *execState) kill(sig syscall.Signal) {
	e.mu.Lock()
	cg, name, gone, pid, running := e.cg, e.cgroup, e.cgroupGone, e.pid, !e.reaped
	e.mu.Unlock()
	if cg != nil {
		if !gone {
			cg.signal(name, sig)
		}
		return
	}
	killTree(pid, running, sig)
}

// dropEmptyCgroup gives the cgroup of an ended exec back (Cgroups.recycle) when nothing it
// started lives on: an empty exec cgroup has no use left. A cgroup per exec, kept until the
// exec is forgotten, was state of the box's kernel that every pause saved and every resume
// restored (and gVisor keeps some of it even for a removed one): 300 execs made an idle box's
// pause twice as slow. A cgroup that still holds processes (what the command left running in
// the background) stays the exec's, for kill and forget.
func (e *execState) dropEmptyCgroup() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cg != nil && !e.cgroupGone && e.cg.recycle(e.cgroup) {
		e.cgroupGone = true
	}
}

// proc is a started exec's process and its stdio.
type proc struct {
	status <-chan syscall.WaitStatus
	io     *stdio
}

// startError is a command that could not start, reported the way a shell does.
type startError struct {
	code int
	msg  string
}

func (s *Server) startExec(req proto.ExecRequest) (proto.ExecInfo, *proto.Error) {
	if !execIDPattern.MatchString(req.ID) {
		return proto.ExecInfo{}, errorf(proto.ErrCodeInvalid, "exec id must match [A-Za-z0-9_-]{1,64}")
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return proto.ExecInfo{}, errorf(proto.ErrCodeInvalid, "argv is empty")
	}
	for _, kv := range req.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return proto.ExecInfo{}, errorf(proto.ErrCodeInvalid, "env entry %q is not KEY=VALUE", kv)
		}
	}
	if req.TimeoutMs < 0 || req.MaxLogBytes < 0 || req.MaxRunning < 0 {
		return proto.ExecInfo{}, errorf(proto.ErrCodeInvalid, "timeout_ms, max_log_bytes and max_running must not be negative")
	}
	if req.Tty != nil && !req.Tty.Valid() {
		return proto.ExecInfo{}, errorf(proto.ErrCodeInvalid, "tty size %dx%d: rows and cols must be within %d..%d",
			req.Tty.Rows, req.Tty.Cols, proto.MinTtyCells, proto.MaxTtyCells)
	}
	maxLog := req.MaxLogBytes
	if maxLog == 0 {
		maxLog = s.opts.DefaultMaxLogBytes
	}

	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return proto.ExecInfo{}, errShuttingDown()
	case s.execs[req.ID] != nil:
		s.mu.Unlock()
		return proto.ExecInfo{}, errorf(proto.ErrCodeExists, "exec %s exists", req.ID)
	case req.MaxRunning > 0 && req.MaxRunning <= s.opts.MaxRunning && s.running >= req.MaxRunning:
		s.mu.Unlock()
		return proto.ExecInfo{}, errorf(proto.ErrCodeTooMany, "%d commands are running in this sandbox, the most allowed at once", req.MaxRunning)
	case s.running >= s.opts.MaxRunning:
		s.mu.Unlock()
		return proto.ExecInfo{}, errorf(proto.ErrCodeUnavailable, "too many running execs (%d)", s.opts.MaxRunning)
	}
	// The log's segments are files of the state folder itself (<id>.log.<n>), with no folder
	// of their own: every file and folder the init keeps is state of the box's kernel that a
	// pause saves, per remembered exec.
	log, err := newExecLog(filepath.Join(s.opts.StateDir, req.ID+".log"), maxLog)
	if err != nil {
		s.mu.Unlock()
		return proto.ExecInfo{}, errorf(proto.ErrCodeInternal, "creating the exec log: %v", err)
	}
	e := &execState{
		id:      req.ID,
		argv:    append([]string(nil), req.Argv...),
		log:     log,
		started: time.Now().UTC(),
		done:    make(chan struct{}),
	}
	s.execs[e.id] = e
	s.running++
	s.wg.Add(1)
	s.mu.Unlock()

	p, serr := s.spawn(e, req)
	if serr != nil {
		defer s.wg.Done()
		e.mu.Lock()
		e.reaped = true // nothing to wait for
		e.mu.Unlock()
		e.log.write(proto.RecordStderr, []byte(serr.msg+"\n"))
		now := time.Now().UTC()
		s.retire(e)
		e.log.finish(proto.ExitStatus{
			ExitCode:   serr.code,
			DurationMs: now.Sub(e.started).Milliseconds(),
			EndedAt:    now,
			Error:      serr.msg,
		})
		e.log.closeFile()
		// A start can fail after the exec's cgroup was made (a working folder that is none, a
		// program execve refuses): the child that could not run has left it.
		e.dropEmptyCgroup()
		close(e.done)
		return e.info(), nil
	}
	go s.supervise(e, p, time.Duration(req.TimeoutMs)*time.Millisecond)
	return e.info(), nil
}

// spawn starts the exec's process in its own process group (and its own cgroup, where the
// init has them) with its pipes.
func (s *Server) spawn(e *execState, req proto.ExecRequest) (*proc, *startError) {
	// The exec's id in its environment is information for the command; nothing relies on it
	// to find the command's processes (a command may drop it).
	env := mergeEnv(s.execBaseEnv(), req.Env, []string{proto.ExecIDEnv + "=" + e.id})
	// The working folder is looked at only when the start fails: the child's chdir finds a
	// missing one anyway, and a start that works pays no stat for it.
	cwd := s.cwd(req.Cwd)
	argv0, serr := lookPath(req.Argv[0], envValue(env, "PATH"), cwd)
	if serr != nil {
		return nil, cwdError(cwd, serr)
	}

	sio, err := s.openStdio(req)
	if err != nil {
		return nil, &startError{127, err.Error()}
	}
	attr := &os.ProcAttr{
		Dir:   cwd,
		Env:   env,
		Files: sio.child[:],
		Sys:   sio.sys,
	}
	fork := func() (*os.Process, error) { return os.StartProcess(argv0, req.Argv, attr) }
	if s.opts.Cgroups != nil {
		name, err := s.opts.Cgroups.create(e.id)
		if err != nil {
			sio.closeChild()
			sio.closeOurs()
			s.log.Error("exec cgroup", "exec", e.id, "err", err)
			return nil, &startError{126, "tracking the command's processes: " + err.Error()}
		}
		e.mu.Lock()
		e.cg, e.cgroup = s.opts.Cgroups, name
		e.mu.Unlock()
		inner := fork
		fork = func() (*os.Process, error) { return s.opts.Cgroups.start(name, inner) }
	}
	pid, status, err := s.startProcess(e, argv0, req.Argv, attr, fork)
	sio.closeChild() // the child holds its own copies
	if err != nil {
		sio.closeOurs()
		code := 126
		if errors.Is(err, fs.ErrNotExist) {
			code = 127
		}
		var perr *fs.PathError
		if errors.As(err, &perr) {
			err = perr.Err
		}
		return nil, cwdError(cwd, &startError{code, fmt.Sprintf("%s: %v", req.Argv[0], err)})
	}

	e.mu.Lock()
	e.pid = pid
	e.in, e.term = sio.in, sio.term
	e.mu.Unlock()
	if s.isClosed() {
		// Close ran while we were starting and could not see the pid.
		e.kill(syscall.SIGKILL)
	}
	if sio.in != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			sio.in.run()
		}()
	}
	return &proc{status: status, io: sio}, nil
}

// startProcess starts an exec's process through the spawner program when there is one
// (spawner.go), and with fork (Go's own) otherwise or when the program cannot take it.
func (s *Server) startProcess(e *execState, argv0 string, argv []string, attr *os.ProcAttr, fork func() (*os.Process, error)) (int, <-chan syscall.WaitStatus, error) {
	sp := s.spawnerNow()
	if sp != nil {
		e.mu.Lock()
		cg, name := e.cg, e.cgroup
		e.mu.Unlock()
		pid, status, err := s.waiter.(*reaper).startPID(func() (int, error) {
			return sp.start(cg, name, argv0, argv, attr)
		})
		if !errors.Is(err, errNoSpawner) {
			return pid, status, err
		}
	}
	return s.waiter.start(fork)
}

// supervise owns a running exec: it collects the pipes into the log, enforces the timeout,
// drains after exit and writes the exit record.
func (s *Server) supervise(e *execState, p *proc, timeout time.Duration) {
	defer s.wg.Done()
	defer close(e.done)
	col := newCollector(e.log, p.io.out, p.io.kinds)
	col.grow = p.io.term == nil
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		col.run()
	}()

	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	var ws syscall.WaitStatus
wait:
	for {
		select {
		case ws = <-p.status:
			break wait
		case <-expired:
			expired = nil
			e.mu.Lock()
			e.timedOut = true
			e.mu.Unlock()
			e.kill(syscall.SIGKILL)
		}
	}
	exited := time.Now().UTC()
	e.mu.Lock()
	e.reaped = true
	e.mu.Unlock()
	// The command ended: its stdin takes no more bytes (what it left unread is dropped).
	if p.io.in != nil {
		p.io.in.shutdown()
	}

	col.stopAt.Store(exited.Add(drainAfterExit).UnixNano())
	<-collected

	code, sig := exitStatus(ws)
	e.mu.Lock()
	timedOut := e.timedOut
	e.mu.Unlock()
	s.retire(e)
	e.log.finish(proto.ExitStatus{
		ExitCode:   code,
		Signal:     sig,
		TimedOut:   timedOut,
		DurationMs: exited.Sub(e.started).Milliseconds(),
		EndedAt:    exited,
	})
	// The exit record first: finish woke the stream that sends it, which on PID 1's one P
	// would otherwise wait for what follows, each a trap into gVisor or more: the closes of
	// the pipes and the log's file, the cgroup's check, the next exec's pipes.
	runtime.Gosched()
	p.io.closeOutput()
	e.log.closeFile()
	e.dropEmptyCgroup()
	if p.io.term == nil {
		s.refillPipes()
	}
}

// maxCollect is the most one read of an output pipe takes (and the size pipes are grown to).
const maxCollect = 1 << 20

// growAt is how much one read of an output pipe must bring for the collector to grow the pipe
// to maxCollect: half of a pipe's default 64 KiB. A command that writes little never needs
// more, and the fcntl per pipe was two more traps into gVisor's kernel for every exec.
const growAt = 32 << 10

// outputPipe makes a pipe for a command's stdout or stderr: the write end a blocking *os.File
// for the child, the read end a raw non-blocking descriptor that the collector reads without
// Go's poller (and grows to maxCollect once output flows: growPipe).
func outputPipe() (r int, w *os.File, err error) {
	var fds [2]int
	if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC); err != nil {
		return -1, nil, err
	}
	// The read end's status flags are O_RDONLY alone: set O_NONBLOCK without reading them
	// first (syscall.SetNonblock's F_GETFL is one more trap into gVisor per pipe).
	if _, err := unix.FcntlInt(uintptr(fds[0]), unix.F_SETFL, unix.O_NONBLOCK); err != nil {
		_ = syscall.Close(fds[0])
		_ = syscall.Close(fds[1])
		return -1, nil, err
	}
	return fds[0], os.NewFile(uintptr(fds[1]), "|output"), nil
}

// outputPipes are an exec's stdout and stderr pipes (outputPipe), made for it or ahead of it.
type outputPipes struct {
	r [2]int
	w [2]*os.File
}

func makeOutputPipes() (*outputPipes, error) {
	p := &outputPipes{r: [2]int{-1, -1}}
	for i := range p.r {
		r, w, err := outputPipe()
		if err != nil {
			p.close()
			return nil, err
		}
		p.r[i], p.w[i] = r, w
	}
	return p, nil
}

func (p *outputPipes) close() {
	for i := range p.r {
		if p.r[i] >= 0 {
			_ = syscall.Close(p.r[i])
		}
		if p.w[i] != nil {
			_ = p.w[i].Close()
		}
	}
}

// takePipes returns the pipes made ahead (refillPipes), or new ones when there are none: an
// exec's start then pays none of the six traps into gVisor that making them takes.
func (s *Server) takePipes() (*outputPipes, error) {
	s.mu.Lock()
	p := s.sparePipes
	s.sparePipes = nil
	s.mu.Unlock()
	if p != nil {
		return p, nil
	}
	return makeOutputPipes()
}

// refillPipes makes the next exec's pipes ahead of it, where none are kept: after an exec's
// exit record went out, and when the init warms up. One pair at most; Close closes it.
func (s *Server) refillPipes() {
	s.mu.Lock()
	need := s.sparePipes == nil && !s.closed
	s.mu.Unlock()
	if !need {
		return
	}
	p, err := makeOutputPipes()
	if err != nil {
		return // the next exec makes its own, and reports what fails
	}
	s.mu.Lock()
	if s.sparePipes == nil && !s.closed {
		s.sparePipes, p = p, nil
	}
	s.mu.Unlock()
	if p != nil {
		p.close()
	}
}

// growPipe grows the pipe of descriptor fd to maxCollect, where the kernel allows: a command
// that writes fast then blocks less often while the collector lingers.
func growPipe(fd int) {
	_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, maxCollect)
}

// Output is coalesced before it goes into the log. Most commands write 4–8 KiB at a time; under
// gVisor each wake-up of a reader is a host context switch, costlier than the copy. A reader
// parked in Go's poller (or in a blocking read) is woken by every such write. So the collector
// waits in poll(2) only while the pipes are quiet; once output flows it reads what gathered
// every outputLinger, with nobody waiting on the pipes in between, and puts output into the log
// when flushAt bytes are pending or the pipes fall quiet. The first output after a quiet spell
// (a command's first byte, a prompt) goes into the log at once; the collector then waits in
// poll(2) for at most one linger, so that more output makes it linger as above and the pipes'
// end (a command that wrote a line and exited) is seen at once rather than after a sleep.
const (
	outputLinger = 2 * time.Millisecond
	flushAt      = 256 << 10
	// quietPoll bounds one poll(2), so that stopAt is noticed.
	quietPoll = 100 * time.Millisecond
)

// collector reads an exec's output into its log: the stdout and stderr pipes, stdout first in
// each round, so records keep the order in which output arrived as far as two pipes can tell
// it; or a terminal's master, one stream. A terminal's master answers EIO once no process
// holds the terminal open any more: that is its end of output, like a pipe's EOF.
type collector struct {
	log   *execLog
	fds   []int
	kinds []byte
	// stopAt (unix nanoseconds, 0 for none) ends collecting even while a background process
	// keeps the pipes open: the supervisor sets it a little after the command exited.
	stopAt atomic.Int64

	// linger is outputLinger (a test sets its own).
	linger time.Duration

	eof []bool
	// grow says the descriptors are pipes, grown by the first read that brings growAt bytes
	// or more (grown); a terminal's master is not a pipe.
	grow  bool
	grown []bool
	buf   []byte // taken while run runs
	// pend is output read but not yet in the log, all of kind pendKind.
	pend     []byte
	pendKind byte
}

func newCollector(log *execLog, fds []int, kinds []byte) *collector {
	return &collector{log: log, fds: fds, kinds: kinds, linger: outputLinger, eof: make([]bool, len(fds)), grown: make([]bool, len(fds))}
}

// spareReadBufs keeps the read buffers (maxCollect bytes each) of the last collectors that
// ended, for the next execs. One made per exec was the init's largest garbage by far: PID 1
// then collected every exec or two and gave the freed pages back to the kernel, madvise calls
// that cost a host round trip each under gVisor, on the exec's path. Two are kept (more execs
// at once make their own); a sync.Pool would empty itself within two collections.
var spareReadBufs = make(chan []byte, 2)

func takeReadBuf() []byte {
	select {
	case b := <-spareReadBufs:
		return b
	default:
		return make([]byte, maxCollect)
	}
}

func giveReadBuf(b []byte) {
	select {
	case spareReadBufs <- b:
	default:
	}
}

// allEOF reports whether every descriptor reached its end.
func (c *collector) allEOF() bool {
	for _, e := range c.eof {
		if !e {
			return false
		}
	}
	return true
}

// run collects until every descriptor reaches its end or stopAt passes, then flushes.
func (c *collector) run() {
	c.buf = takeReadBuf()
	defer func() {
		giveReadBuf(c.buf)
		c.buf = nil
	}()
	defer c.flush()
	// A command just started has written nothing yet, most likely: wait for output before the
	// first read rather than find the pipes empty (a read per pipe, each a trap into gVisor).
	// After a wait, only the descriptors it found readable (or ended) are read.
	ready := c.poll(quietPoll)
	quiet := true // nothing was read since the last wait for output
	for {
		if stop := c.stopAt.Load(); stop != 0 && time.Now().UnixNano() >= stop {
			return
		}
		progress := c.readRound(ready)
		if c.allEOF() {
			return
		}
		switch {
		case progress && quiet:
			// The first output after a quiet spell goes out at once; then wait one linger at
			// most, woken early by more output (which then lingers) or by the pipes' end.
			c.flushOut()
			quiet = false
			ready = c.poll(c.linger)
		case progress:
			// Output flows: let more gather in the pipes before reading again.
			time.Sleep(c.linger)
			ready = allFds
		default:
			// The pipes are quiet: what was read goes out now, then wait for more.
			c.flushOut()
			ready = c.poll(quietPoll)
			quiet = true
		}
	}
}

// allFds is the set of every descriptor a collector reads (bit j: c.fds[j]).
const allFds = ^uint64(0)

// readRound reads each open descriptor of the set ready once and reports whether anything
// came.
func (c *collector) readRound(ready uint64) bool {
	progress := false
	for j := range c.fds {
		if c.eof[j] || ready&(1<<j) == 0 {
			continue
		}
		n, err := syscall.Read(c.fds[j], c.buf)
		switch {
		case n > 0:
			if c.grow && n >= growAt && !c.grown[j] {
				growPipe(c.fds[j])
				c.grown[j] = true
			}
			if len(c.pend) > 0 && c.pendKind != c.kinds[j] {
				c.flush() // the other stream's output came first
			}
			c.pend = append(c.pend, c.buf[:n]...)
			c.pendKind = c.kinds[j]
			if len(c.pend) >= flushAt {
				c.flush()
			}
			progress = true
		case err == syscall.EINTR:
			progress = true
		case err == syscall.EAGAIN:
		default: // EOF, a broken pipe, or EIO from a terminal's master
			c.eof[j] = true
		}
	}
	return progress
}

// poll waits until a pipe is readable (or closed), timeout passes, or stopAt comes, and
// returns the set of descriptors to read (bit j: c.fds[j]): those it found readable or at
// their end, none when the wait timed out, all when it could not tell.
func (c *collector) poll(timeout time.Duration) uint64 {
	if stop := c.stopAt.Load(); stop != 0 {
		timeout = min(timeout, time.Until(time.Unix(0, stop)))
	}
	if timeout <= 0 {
		return allFds
	}
	// Two pipes or one terminal: no allocation per wait.
	var fdsBuf [2]unix.PollFd
	var idxBuf [2]int
	fds, idx := fdsBuf[:0], idxBuf[:0]
	for j, fd := range c.fds {
		if !c.eof[j] {
			fds = append(fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
			idx = append(idx, j)
		}
	}
	got, err := unix.Poll(fds, int(max(timeout.Milliseconds(), 1)))
	if err != nil || len(c.fds) > 64 {
		return allFds
	}
	var ready uint64
	for i := range fds {
		if got > 0 && fds[i].Revents != 0 {
			ready |= 1 << idx[i]
		}
	}
	return ready
}

// flushOut is flush before the collector waits in poll(2): the log's readers that the write
// woke (the stream that sends the output to the host) run first. On PID 1's one P they would
// otherwise wait until the Go runtime takes the P back from the blocked poll, a tick of its
// sysmon and a hand-off to another thread later, on the way of a command's first byte.
func (c *collector) flushOut() {
	if c.flush() {
		runtime.Gosched()
	}
}

// flush puts pending output into the log and reports whether there was any.
func (c *collector) flush() bool {
	if len(c.pend) == 0 {
		return false
	}
	c.log.write(c.pendKind, c.pend)
	if cap(c.pend) > 2*maxCollect {
		c.pend = nil
	} else {
		c.pend = c.pend[:0]
	}
	return true
}

// retire moves an exec to the ended list and forgets the oldest ended ones: beyond
// KeepEnded of them, or while the logs of all but the newest hold more than KeepEndedBytes.
// It runs before the exit record is written, so that whoever sees the record sees the
// bookkeeping done.
func (s *Server) retire(e *execState) {
	s.mu.Lock()
	s.running--
	s.ended = append(s.ended, e.id)
	// The bytes the ended logs keep, all but the newest (e, whose log is still being
	// finished: it is never dropped here).
	var olderBytes int64
	for _, id := range s.ended[:len(s.ended)-1] {
		if old := s.execs[id]; old != nil {
			kept, _ := old.log.usage()
			olderBytes += kept
		}
	}
	var drop []*execState
	for len(s.ended) > s.opts.KeepEnded || len(s.ended) > 1 && olderBytes > s.opts.KeepEndedBytes {
		old := s.execs[s.ended[0]]
		delete(s.execs, s.ended[0])
		s.ended = s.ended[1:]
		if old != nil {
			kept, _ := old.log.usage()
			olderBytes -= kept
			drop = append(drop, old)
		}
	}
	s.mu.Unlock()
	for _, old := range drop {
		old.discard()
	}
}

// discard removes what a forgotten exec kept: its log's files and its cgroup.
func (e *execState) discard() {
	e.log.remove()
	e.mu.Lock()
	cg, name, gone := e.cg, e.cgroup, e.cgroupGone
	e.mu.Unlock()
	if cg != nil && !gone {
		cg.remove(name)
	}
}

// forgetExec drops an ended exec as if it never ran: what it left running in the background
// is killed, its record, log and cgroup go, and no listing, read or signal finds it any more.
// A running exec is refused (ErrCodeState): signal it and wait for its end first. The control
// plane forgets the warm-up command it runs in a pool box before anyone claims the box.
func (s *Server) forgetExec(id string) *proto.Error {
	s.mu.Lock()
	e := s.execs[id]
	if e == nil {
		s.mu.Unlock()
		return errorf(proto.ErrCodeNotFound, "no exec %s", id)
	}
	if !e.log.isEnded() {
		s.mu.Unlock()
		return errorf(proto.ErrCodeState, "exec %s is running; signal it and wait for its end first", id)
	}
	s.unlistLocked(id)
	s.mu.Unlock()
	// Its exit record is out; its cgroup's recycling follows at once.
	<-e.done
	e.kill(syscall.SIGKILL) // what it left in the background (none: nothing to signal)
	e.discard()
	return nil
}

// unlistLocked takes exec id off the server's records: the map every lookup reads and the
// list of ended execs that retire bounds. s.mu is held.
func (s *Server) unlistLocked(id string) {
	delete(s.execs, id)
	s.ended = slices.DeleteFunc(s.ended, func(x string) bool { return x == id })
}

// cwd resolves an exec's working directory: relative to the workspace, and a path under
// /workspace is mapped to the server's workspace when that lives elsewhere (a host driver).
func (s *Server) cwd(dir string) string {
	switch {
	case dir == "":
		return s.ws
	case !filepath.IsAbs(dir):
		return filepath.Join(s.ws, dir)
	}
	if s.ws != proto.Workspace {
		if c := path.Clean(dir); c == proto.Workspace || strings.HasPrefix(c, proto.Workspace+"/") {
			return filepath.Join(s.ws, strings.TrimPrefix(c, proto.Workspace))
		}
	}
	return dir
}

// cwdError is the start error of a command whose start failed with serr: a shell's "cd" error
// when its working folder cwd is not one, else serr.
func cwdError(cwd string, serr *startError) *startError {
	fi, err := os.Stat(cwd)
	if err == nil && fi.IsDir() {
		return serr
	}
	reason := "No such file or directory"
	if err == nil {
		reason = "Not a directory"
	} else if errors.Is(err, fs.ErrPermission) {
		reason = "Permission denied"
	}
	return &startError{127, fmt.Sprintf("cd: %s: %s", cwd, reason)}
}

// lookPath finds a command the way a shell does, with the exec's own PATH.
func lookPath(file, pathEnv, cwd string) (string, *startError) {
	if strings.Contains(file, "/") {
		p := file
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		if err := checkExecutable(p); err != nil {
			return "", &startError{err.code, file + ": " + err.msg}
		}
		return p, nil
	}
	var denied *startError
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		p := filepath.Join(dir, file)
		err := checkExecutable(p)
		if err == nil {
			return p, nil
		}
		if err.code == 126 && denied == nil {
			denied = &startError{126, file + ": " + err.msg}
		}
	}
	if denied != nil {
		return "", denied
	}
	return "", &startError{127, file + ": command not found"}
}

func checkExecutable(p string) *startError {
	fi, err := os.Stat(p)
	switch {
	case err != nil:
		return &startError{127, "No such file or directory"}
	case fi.IsDir():
		return &startError{126, "Is a directory"}
	case fi.Mode()&0o111 == 0:
		return &startError{126, "Permission denied"}
	}
	return nil
}

// mergeEnv joins KEY=VALUE lists; a later list overrides an earlier one, order is kept.
func mergeEnv(lists ...[]string) []string {
	var out []string
	at := make(map[string]int)
	for _, list := range lists {
		for _, kv := range list {
			k, _, _ := strings.Cut(kv, "=")
			if i, ok := at[k]; ok {
				out[i] = kv
				continue
			}
			at[k] = len(out)
			out = append(out, kv)
		}
	}
	return out
}

func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

// DefaultBaseEnv is the environment every exec starts from when Options.BaseEnv is nil:
// a standard PATH, HOME and LANG, overridden by the init's own environment (the profile's env
// in the OCI spec or pod), without the init's own SBX_* settings.
func DefaultBaseEnv() []string {
	var own []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "SBX_") {
			continue
		}
		own = append(own, kv)
	}
	return mergeEnv([]string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
		"LANG=C.UTF-8",
	}, own)
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		if f != nil {
			_ = f.Close()
		}
	}
}

// Warm readies the starts of execs in the background of PID 1's first moments, and again after
// a restore: the spawner thread's first fork (Cgroups.Warm), and the spawner program (started
// when it does not run, else made to pay its own first clone).
func (s *Server) Warm() error {
	if s.isClosed() {
		return nil
	}
	s.wg.Add(1)
	defer s.wg.Done()
	var errs []error
	if s.opts.Cgroups != nil {
		errs = append(errs, s.opts.Cgroups.Warm(func(fork func() (*os.Process, error)) error {
			_, _, err := s.waiter.start(fork)
			return err
		}))
	}
	if s.opts.Spawner != "" {
		errs = append(errs, s.warmSpawner())
	}
	s.refillPipes()
	return errors.Join(errs...)
}

// spawnerNow is the spawner program the server has (nil: none yet, or it forks itself).
func (s *Server) spawnerNow() *spawner {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.spawner
}

// unrunnable is a path that cannot be executed (a file under the init's own binary: ENOTDIR):
// a start of it pays a first clone and runs nothing. ranNothing says a start of it failed so.
func unrunnable() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	return self + "/.warm", nil
}

func ranNothing(err error) bool {
	return errors.Is(err, syscall.ENOTDIR) || errors.Is(err, fs.ErrNotExist)
}

// warmSpawner starts the spawner program (Options.Spawner) where PID 1 reaps and none runs:
// from the spawner thread when there are exec cgroups (so it carries that thread's seccomp
// filter and bounding set, as every command does). Either way it then has the program start
// one process that cannot run: a program's first clone, and its first after a restore, costs
// more than the others.
func (s *Server) warmSpawner() error {
	r, ok := s.waiter.(*reaper)
	if !ok {
		return nil // its children are PID 1's: only a reaping PID 1 can take them
	}
	s.warmMu.Lock()
	defer s.warmMu.Unlock()
	sp := s.spawnerNow()
	if sp != nil {
		if pid, _ := sp.state(); pid != 0 {
			return sp.warm(s.devNull)
		}
	}
	place := func(fork func() (*os.Process, error)) (*os.Process, error) { return fork() }
	if s.opts.Cgroups != nil {
		place = func(fork func() (*os.Process, error)) (*os.Process, error) { return s.opts.Cgroups.start("", fork) }
	}
	sp, err := startSpawner(s.log, s.opts.Spawner, r, place, s.devNull, s.spawnerEnded)
	if errors.Is(err, fs.ErrNotExist) {
		// An image of the Kubernetes runtime that carries the init without the program.
		s.log.Info("no spawner program in the box: PID 1 starts the commands itself", "path", s.opts.Spawner)
		return nil
	}
	if err != nil {
		return err
	}
	if err := sp.warm(s.devNull); err != nil {
		sp.close()
		return err
	}
	s.mu.Lock()
	s.spawner = sp
	s.mu.Unlock()
	s.log.Info("the spawner program starts the commands", "path", s.opts.Spawner, "pid", sp.pid)
	return nil
}

// spawnerRestartDelay is how long after the spawner program's first unexpected end a new one
// is started (nanoseconds; 0: a second, what a test may change); it doubles with every
// further end, up to spawnerRestartMax. A command that kills the program (`kill -9 -1` kills
// every process it may) slows the box's later starts only until then; one that kills it
// again and again costs PID 1 a fork per minute at most.
var spawnerRestartDelay atomic.Int64

const spawnerRestartMax = time.Minute

// spawnerEnded replaces a spawner program that ended other than by Close, after a delay.
func (s *Server) spawnerEnded() {
	s.mu.Lock()
	s.spawnerEnds++
	delay := time.Duration(spawnerRestartDelay.Load())
	if delay == 0 {
		delay = time.Second
	}
	delay <<= min(s.spawnerEnds-1, 6)
	s.mu.Unlock()
	time.AfterFunc(min(delay, spawnerRestartMax), func() {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		s.wg.Add(1) // under s.mu: Close waits for it, or it sees closed
		s.mu.Unlock()
		defer s.wg.Done()
		if err := s.warmSpawner(); err != nil {
			s.log.Warn("replacing the spawner program", "err", err)
		}
	})
}
