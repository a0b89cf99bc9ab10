package server

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"sandboxd/guest/proto"
)

// Cgroups tracks every exec's processes in a cgroup of its own, in the cgroupfs that gVisor's
// kernel implements inside the sandbox (PID 1 of a box only: never the host's cgroups). A
// process cannot leave its cgroup by anything it does to its session, process group, parent
// or environment, and every child starts in its parent's cgroup, so an exec's cgroup holds
// exactly the processes it started, alive, wherever they went. Killing an exec is then:
// signal every process its cgroup lists, and for SIGKILL repeat until it lists none.
//
// How the processes get there and stay there:
//   - OpenCgroups mounts the hierarchy of gVisor's "job" controller (which nothing else in a
//     box uses), keeps a descriptor of its root and unmounts it at once: no path in the box
//     reaches the hierarchy, only that descriptor, which PID 1 (non-dumpable, so not
//     readable through /proc/1/fd) never passes on.
//   - An exec's process is forked from the spawner, one OS thread of PID 1 kept for that,
//     which moves into the exec's cgroup for the fork and back right after it: the child
//     starts inside, and so does everything it ever forks.
//   - A command holds no CAP_SYS_ADMIN, so it cannot mount the hierarchy itself; but in a
//     user namespace of its own it would hold it there, and gVisor then lets it mount a view
//     of the same hierarchy and write itself into the root's tasks file (tried on this
//     runsc: `unshare -Urm`, mount -t cgroup -o job, echo $$ > tasks). Seal closes that: a
//     seccomp filter on the spawner's thread, inherited by every process it starts, refuses
//     every call that mounts a file system.
//
// A Cgroups belongs to one process (PID 1) and is safe for concurrent use.
type Cgroups struct {
	root int // O_DIRECTORY descriptor of the hierarchy's root

	seq atomic.Uint64 // suffixes names that are taken (see create)

	// spawnMu guards spawns, the requests of the spawner: the one OS thread every exec's
	// process is forked from (see start). nil until Seal or the first start.
	spawnMu sync.Mutex
	spawns  chan spawnReq
	closed  bool

	mu sync.Mutex
	// pending are the cgroups of forgotten execs that still held processes when they were
	// removed; each later remove tries them again.
	pending map[string]struct{}
	// free are the emptied cgroups of ended execs, for the next execs to take (recycle):
	// gVisor keeps about a kilobyte of its kernel's state for every cgroup ever made, removed
	// or not, which every pause of the box saves and every resume restores. At most
	// maxFreeCgroups.
	free []string
}

// maxFreeCgroups bounds the emptied cgroups kept for reuse: more execs than this running at
// once make new ones, removed when they end.
const maxFreeCgroups = 16

// cgroupController is the controller whose hierarchy holds the execs' cgroups: gVisor's own
// "job" controller, which has no limits and which runsc does not mount in a container.
// (Mounting every controller fails with EBUSY: runsc has hierarchies of the others.) Linux
// has no such controller, so on a Linux kernel the mount fails instead of touching the host.
const cgroupController = "job"

// OpenCgroups prepares exec tracking by cgroup. Only PID 1 of a sandbox calls it, once, at
// start, while it still holds CAP_SYS_ADMIN and before it starts anything; it fails
// everywhere else (any other pid, a kernel without gVisor's job controller), and the server
// then tracks processes by process group and parentage (see killTree). It leaves no mount
// behind, and refuses when the job hierarchy is mounted anywhere a command could reach.
//
// After PID 1's own mounts are done, call Seal (the first exec started in a cgroup does it
// otherwise).
func OpenCgroups() (*Cgroups, error) {
	if os.Getpid() != 1 {
		return nil, errors.New("guest: cgroup tracking is only for PID 1 inside a sandbox")
	}
	// Start Go's template thread now, while every thread of the process is in the root
	// cgroup: the runtime creates new threads from it whenever the creating thread is locked,
	// so no thread of PID 1 is ever cloned from one that stands in an exec's cgroup.
	runtime.LockOSThread()
	runtime.UnlockOSThread()

	dir, err := os.MkdirTemp(mountDir(), ".cgroup-")
	if err != nil {
		return nil, fmt.Errorf("guest: cgroups: mount point: %w", err)
	}
	defer os.Remove(dir)
	if err := unix.Mount("cgroup", dir, "cgroup", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, cgroupController); err != nil {
		return nil, fmt.Errorf("guest: cgroups: mounting the %s hierarchy: %w", cgroupController, err)
	}
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if uerr := unix.Unmount(dir, unix.MNT_DETACH); uerr != nil && err == nil {
		// Still mounted where a command could reach it: do not use it.
		unix.Close(fd)
		return nil, fmt.Errorf("guest: cgroups: detaching the hierarchy: %w", uerr)
	}
	if err != nil {
		return nil, fmt.Errorf("guest: cgroups: opening the hierarchy: %w", err)
	}
	c := &Cgroups{root: fd, pending: make(map[string]struct{})}
	if err := c.check(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// mountDir is where OpenCgroups makes its short-lived mount point: the init's tmpfs, or the
// temporary folder when that does not exist.
func mountDir() string {
	dir := proto.StateDir[:strings.LastIndexByte(proto.StateDir, '/')] // /run/sbx
	if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
		return dir
	}
	return os.TempDir()
}

// check proves the detached hierarchy works through its descriptor (a cgroup can be made,
// listed and removed) and that no mount of it is visible.
func (c *Cgroups) check() error {
	probe := fmt.Sprintf(".probe-%d", time.Now().UnixNano())
	if err := unix.Mkdirat(c.root, probe, 0o700); err != nil {
		return fmt.Errorf("guest: cgroups: making a cgroup: %w", err)
	}
	_, err := c.procs(probe)
	if rerr := unix.Unlinkat(c.root, probe, unix.AT_REMOVEDIR); rerr != nil && err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("guest: cgroups: using a cgroup: %w", err)
	}
	mounted, err := jobHierarchyMounted()
	if err != nil {
		return fmt.Errorf("guest: cgroups: %w", err)
	}
	if mounted != "" {
		return fmt.Errorf("guest: cgroups: the %s hierarchy is mounted at %s, where commands could leave their cgroup", cgroupController, mounted)
	}
	return nil
}

// jobHierarchyMounted returns the mount point of a cgroupfs mount of the job controller that
// this process can see, or "".
func jobHierarchyMounted() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, pf := strings.Fields(post), strings.Fields(pre)
		if len(f) < 3 || len(pf) < 5 || f[0] != "cgroup" {
			continue
		}
		for _, o := range strings.Split(f[2], ",") {
			if o == cgroupController {
				return pf[4], nil
			}
		}
	}
	return "", sc.Err()
}

// Close releases the hierarchy's descriptor. Nothing may use c afterwards.
func (c *Cgroups) Close() error {
	c.spawnMu.Lock()
	c.closed = true // a spawner, once started, lives as long as PID 1
	c.spawnMu.Unlock()
	return unix.Close(c.root)
}

// Seal starts the spawner: the one OS thread of PID 1 that every exec's process is forked
// from (start). It carries a seccomp filter, inherited by every process it starts, that
// refuses (EPERM) each system call that mounts a file system: mount, fsopen, fsconfig,
// fsmount, fspick, open_tree, move_mount, mount_setattr. A command without CAP_SYS_ADMIN
// cannot mount anyway, except inside a user namespace of its own, which is how it could
// otherwise reach the exec hierarchy. PID 1's other threads carry no filter: gVisor rebuilds a
// task's seccomp state at every clone, so a filter on all of PID 1 would tax each thread the
// Go runtime makes (about 0.2 ms each, several per early exec); PID 1 itself holds no
// CAP_SYS_ADMIN once set up and forks nothing elsewhere. Calling it again does nothing; start
// calls it too.
//
// The filter only looks at the system call number, so gVisor caches its verdict per number
// and the commands' other calls pay nothing for it.
func (c *Cgroups) Seal() error {
	_, err := c.spawner()
	return err
}

// spawnReq asks the spawner to fork a process in cgroup name.
type spawnReq struct {
	name string
	fork func() (*os.Process, error)
	done chan spawnResult
}

type spawnResult struct {
	p   *os.Process
	err error
}

// spawner returns the spawner's request channel, starting it (filter first) when there is
// none.
func (c *Cgroups) spawner() (chan<- spawnReq, error) {
	c.spawnMu.Lock()
	defer c.spawnMu.Unlock()
	if c.closed {
		return nil, errors.New("guest: cgroups: closed")
	}
	if c.spawns != nil {
		return c.spawns, nil
	}
	ch := make(chan spawnReq)
	ready := make(chan error, 1)
	go c.spawnLoop(ch, ready)
	if err := <-ready; err != nil {
		return nil, fmt.Errorf("guest: cgroups: refusing mounts: %w", err)
	}
	c.spawns = ch
	return ch, nil
}

// spawnLoop is the spawner: a goroutine locked to its OS thread for good, which filters the
// thread (installMountFilter) and then, for each request, moves the thread into the exec's
// cgroup, forks, and moves it back. A thread that cannot move back is retired (the goroutine
// ends locked, so the runtime ends the thread) after starting a new spawner on the same
// channel.
func (c *Cgroups) spawnLoop(ch chan spawnReq, ready chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread is the spawner's alone
	// What its children may ever hold at execve: never CAP_SYS_ADMIN, which PID 1 starts with
	// (its other threads never execve; PID 1 drops the capability's other sets on all).
	if err := unix.Prctl(unix.PR_CAPBSET_DROP, unix.CAP_SYS_ADMIN, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		ready <- fmt.Errorf("dropping CAP_SYS_ADMIN from the spawner's bounding set: %w", err)
		return
	}
	if err := installMountFilter(false); err != nil {
		ready <- err
		return
	}
	// The root's tasks file, kept open for the way back after every fork: an open and a close
	// fewer per exec, each a trap into gVisor's kernel.
	back, err := unix.Openat(c.root, "tasks", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		ready <- fmt.Errorf("opening the root cgroup's tasks: %w", err)
		return
	}
	defer unix.Close(back)
	ready <- nil
	tid := strconv.Itoa(unix.Gettid())
	for req := range ch {
		if req.name == "" {
			// A process of PID 1's own (the spawner program, spawner.go): the root cgroup.
			p, err := req.fork()
			req.done <- spawnResult{p, err}
			continue
		}
		if err := c.write(req.name+"/tasks", tid); err != nil {
			req.done <- spawnResult{nil, fmt.Errorf("entering the exec's cgroup: %w", err)}
			continue
		}
		p, err := req.fork()
		if _, werr := unix.Write(back, []byte(tid)); werr != nil {
			req.done <- spawnResult{p, err}
			go c.spawnLoop(ch, make(chan error, 1)) // on a new thread, filtered before it serves
			return
		}
		req.done <- spawnResult{p, err}
	}
}

// RefuseMounts installs Seal's filter without exec cgroups: what PID 1 does when it could not
// open them, so that a command still cannot mount in a user namespace of its own (to uncover
// what PID 1 hid, say). Call it once, after PID 1's own mounts.
func RefuseMounts() error {
	if err := installMountFilter(true); err != nil {
		return fmt.Errorf("guest: refusing mounts: %w", err)
	}
	return nil
}

// mountSyscalls are the system calls Seal refuses.
var mountSyscalls = []uint32{
	unix.SYS_MOUNT, unix.SYS_FSOPEN, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT, unix.SYS_FSPICK,
	unix.SYS_OPEN_TREE, unix.SYS_MOVE_MOUNT, unix.SYS_MOUNT_SETATTR,
}

// x32SyscallBit marks the x32 ABI's system call numbers on amd64; the filter refuses them all
// (gVisor does not implement x32, and they would bypass the numbers above).
const x32SyscallBit = 0x40000000

// mountFilter is the BPF program of Seal for an audit architecture: a call of another
// architecture gets ENOSYS, and on amd64 every x32 call too.
func mountFilter(auditArch uint32, amd64 bool) []unix.SockFilter {
	const (
		ldAbsW = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jgeK   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		retK   = unix.BPF_RET | unix.BPF_K
		// offsets in struct seccomp_data
		offNr   = 0
		offArch = 4
	)
	allow := unix.SockFilter{Code: retK, K: unix.SECCOMP_RET_ALLOW}
	eperm := unix.SockFilter{Code: retK, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)}
	enosys := unix.SockFilter{Code: retK, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)}

	// Layout: [arch check] [x32 check] [one jeq per syscall] allow eperm enosys
	n := len(mountSyscalls)
	var prog []unix.SockFilter
	prog = append(prog, unix.SockFilter{Code: ldAbsW, K: offArch})
	// Jump targets are relative to the next instruction.
	rest := n + 1 // the jeqs and the load of nr
	if amd64 {
		rest++
	}
	// arch != auditArch → enosys (skip everything up to it: rest + allow + eperm)
	prog = append(prog, unix.SockFilter{Code: jeqK, K: auditArch, Jt: 0, Jf: uint8(rest + 2)})
	prog = append(prog, unix.SockFilter{Code: ldAbsW, K: offNr})
	if amd64 {
		// nr >= x32SyscallBit → enosys
		prog = append(prog, unix.SockFilter{Code: jgeK, K: x32SyscallBit, Jt: uint8(n + 2), Jf: 0})
	}
	for i, nr := range mountSyscalls {
		// match → eperm, which follows the remaining jeqs and allow
		prog = append(prog, unix.SockFilter{Code: jeqK, K: nr, Jt: uint8(n - i), Jf: 0})
	}
	return append(prog, allow, eperm, enosys)
}

// installMountFilter installs mountFilter for this architecture on the calling thread (which
// must be locked to its goroutine), or with all on every thread of the process.
func installMountFilter(all bool) error {
	var arch uint32
	switch runtime.GOARCH {
	case "amd64":
		arch = unix.AUDIT_ARCH_X86_64
	case "arm64":
		arch = unix.AUDIT_ARCH_AARCH64
	default:
		return fmt.Errorf("no seccomp filter for %s", runtime.GOARCH)
	}
	prog := mountFilter(arch, runtime.GOARCH == "amd64")
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	// A filter needs no_new_privs or CAP_SYS_ADMIN. The runtime's spec sets no_new_privs for
	// the whole box already (noNewPrivileges), so setting it changes nothing for commands;
	// TSYNC gives it to the other threads with the filter.
	var flags uintptr
	if all {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		flags = unix.SECCOMP_FILTER_FLAG_TSYNC
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	r, _, e := syscall.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if e != 0 {
		return fmt.Errorf("seccomp: %w", e)
	}
	if r != 0 {
		return fmt.Errorf("seccomp: thread %d could not take the filter", r)
	}
	return nil
}

// create takes a recycled cgroup for a new exec, or makes one, and returns its name: the
// exec's id, or the id with a suffix when a cgroup of that name still holds processes of a
// forgotten exec of the same id. It holds c.mu throughout: the one it may remove in its way
// (empty, of a forgotten or ended exec) is then never one recycle has just made free.
func (c *Cgroups) create(id string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := len(c.free); n > 0 {
		name := c.free[n-1]
		c.free = c.free[:n-1]
		return name, nil
	}
	name := id
	for range 3 {
		err := unix.Mkdirat(c.root, name, 0o700)
		if err == nil {
			return name, nil
		}
		if !errors.Is(err, unix.EEXIST) {
			return "", fmt.Errorf("making the exec's cgroup: %w", err)
		}
		if unix.Unlinkat(c.root, name, unix.AT_REMOVEDIR) == nil {
			delete(c.pending, name)
			continue
		}
		name = fmt.Sprintf("%s.%d", id, c.seq.Add(1))
	}
	return "", fmt.Errorf("making the exec's cgroup: %s exists", name)
}

// start runs fork (which starts a process) on the spawner's thread (see Seal) while it stands
// in cgroup name, so that the process starts inside it, filtered; with name "" the thread
// stays in the root cgroup.
func (c *Cgroups) start(name string, fork func() (*os.Process, error)) (*os.Process, error) {
	ch, err := c.spawner()
	if err != nil {
		return nil, err
	}
	done := make(chan spawnResult, 1)
	select {
	case ch <- spawnReq{name: name, fork: fork, done: done}:
	case <-time.After(30 * time.Second):
		// Only a spawner that could not be replaced leaves the channel unread.
		return nil, errors.New("guest: cgroups: the spawner does not answer")
	}
	r := <-done
	return r.p, r.err
}

// openTasks opens the tasks file of cgroup name for writing: a process that writes "0" (itself)
// or its pid there enters the cgroup (the spawner program's children do, before execve).
func (c *Cgroups) openTasks(name string) (int, error) {
	if name == "" {
		return -1, errors.New("guest: cgroups: no cgroup named")
	}
	return unix.Openat(c.root, name+"/tasks", unix.O_WRONLY|unix.O_CLOEXEC, 0)
}

// write writes s to the file name (relative to the hierarchy's root) in one write.
func (c *Cgroups) write(name, s string) error {
	fd, err := unix.Openat(c.root, name, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	_, err = unix.Write(fd, []byte(s))
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	return err
}

// procs lists the processes (thread-group ids) in cgroup name. Processes leave their cgroup
// as they exit, before they are zombies.
func (c *Cgroups) procs(name string) ([]int, error) {
	fd, err := unix.Openat(c.root, name+"/cgroup.procs", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var buf bytes.Buffer
	chunk := make([]byte, 4096)
	for {
		n, err := unix.Read(fd, chunk)
		if n > 0 {
			buf.Write(chunk[:n])
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			break
		}
	}
	var pids []int
	for _, f := range bytes.Fields(buf.Bytes()) {
		if pid, err := strconv.Atoi(string(f)); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// signal sends sig to every process in cgroup name (never to this process, whose spawning
// thread may stand in it for a moment). For SIGKILL it repeats until the cgroup is empty:
// a process forked between a listing and the kill is in the next listing, and a killed one
// cannot fork, so this ends even for a fork bomb; the rounds are bounded all the same.
func (c *Cgroups) signal(name string, sig syscall.Signal) {
	self := os.Getpid()
	delay := time.Millisecond
	for round := 0; ; round++ {
		pids, err := c.procs(name)
		if err != nil {
			return
		}
		sent := 0
		for _, pid := range pids {
			if pid <= 1 || pid == self {
				continue
			}
			_ = syscall.Kill(pid, sig)
			sent++
		}
		if sig != syscall.SIGKILL || sent == 0 || round >= killRounds {
			return
		}
		time.Sleep(delay)
		delay = min(2*delay, 20*time.Millisecond)
	}
}

// killRounds bounds the rounds of a SIGKILL (about a second and a half of retries).
const killRounds = 80

// recycle takes back cgroup name of an ended exec when it holds no process: kept for the next
// exec (create), or removed when maxFreeCgroups are kept. It reports whether the exec gave it
// up; one that still holds processes stays the exec's. Nothing can enter an empty exec cgroup
// (only the spawner's thread moves into one, for an exec's start), so the next exec to take it
// finds only its own processes there.
func (c *Cgroups) recycle(name string) bool {
	if pids, err := c.procs(name); err != nil || len(pids) > 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.free) < maxFreeCgroups {
		c.free = append(c.free, name)
		return true
	}
	err := unix.Unlinkat(c.root, name, unix.AT_REMOVEDIR)
	return err == nil || errors.Is(err, unix.ENOENT)
}

// remove removes the cgroup of a forgotten exec. One that still holds processes (what a
// command left running in the background) is kept and tried again at every later remove.
func (c *Cgroups) remove(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending[name] = struct{}{}
	for n := range c.pending {
		err := unix.Unlinkat(c.root, n, unix.AT_REMOVEDIR)
		if err == nil || errors.Is(err, unix.ENOENT) {
			delete(c.pending, n)
		}
	}
}

// Warm makes one clone through the spawner, in a cgroup of its own: gVisor sets up a seccomp
// filter's state for a task at its first clone, which would otherwise land on the box's first
// exec. The child only fails to execute a path that cannot exist (a file under the init
// binary) and exits, so nothing runs. PID 1 does it in the background once it serves, and
// again after a restore; an exec that comes meanwhile waits for the spawner. start starts a
// process the way the server starts an exec's (its waiter, which keeps a failing start from
// racing the reaper). The cgroup is an ended exec's when one is free, and is given back for
// the next exec: a cgroup made and removed at every restore would leave its trace in every
// later checkpoint (see recycle).
func (c *Cgroups) Warm(start func(fork func() (*os.Process, error)) error) error {
	name, err := c.create(".warm")
	if err != nil {
		return err
	}
	defer func() {
		if !c.recycle(name) {
			c.remove(name)
		}
	}()
	none, err := unrunnable()
	if err != nil {
		return err
	}
	err = start(func() (*os.Process, error) {
		return c.start(name, func() (*os.Process, error) {
			return os.StartProcess(none, []string{none}, &os.ProcAttr{Dir: "/"})
		})
	})
	if err == nil {
		return errors.New("guest: cgroups: the warm-up started a process")
	}
	if ranNothing(err) {
		return nil
	}
	return err
}
