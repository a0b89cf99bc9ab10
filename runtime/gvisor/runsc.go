package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/runtime"
)

// globalFlags are runsc's global flags for a box. runsc needs them identical on every call
// for one container (a create with --network=none and a start without it fails), so they
// are built here only, stored beside the box when its container is created (flagsFile) and
// read back for every later call on that container.
func (d *Driver) globalFlags(spec runtime.BoxSpec) ([]string, error) {
	network, err := networkFlag(spec)
	if err != nil {
		return nil, err
	}
	flags := []string{
		"--root=" + d.rootDir,
		"--platform=" + d.opts.Platform,
		"--network=" + network,
		// The guest init may create its host socket (and only create: the sandbox cannot
		// connect to any host socket), so attaches dial it instead of running `runsc exec`.
		"--host-uds=create",
	}
	return append(flags, d.opts.ExtraFlags...), nil
}

// containerFlags returns the flags the box's current container was made with, or the flags
// its record's spec gives when none were stored.
func (d *Driver) containerFlags(id string) ([]string, error) {
	if b, err := os.ReadFile(d.boxes.boxPath(id, flagsFile)); err == nil {
		var flags []string
		if err := json.Unmarshal(b, &flags); err == nil && len(flags) > 0 {
			return flags, nil
		}
	}
	rec, err := d.boxes.readRecord(id)
	if err != nil {
		if errors.Is(err, runtime.ErrNotFound) {
			return d.globalFlags(runtime.BoxSpec{})
		}
		return nil, err
	}
	return d.globalFlags(rec.Spec)
}

const (
	cliTimeout   = 30 * time.Second
	maxCLIOutput = 64 << 10
)

// runsc runs one short runsc command (never create/start/exec, whose sandbox may keep the
// stdio open) and returns its stdout; errors carry the command's stderr.
func (d *Driver) runsc(ctx context.Context, flags []string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.opts.Runsc, append(append([]string{}, flags...), args...)...)
	var stdout, stderr limitedBuffer
	stdout.max, stderr.max = maxCLIOutput, 4<<10
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("runsc %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// runscLogged runs runsc create or start with its stdio on the box's log file: the sandbox
// inherits them and keeps them open, so they must never be a pipe read to EOF. The log file
// is opened O_APPEND so the sandbox's writes never overwrite each other. The command gets
// timeout (cliTimeout for create and start, imageTimeout for a restore).
func (d *Driver) runscLogged(ctx context.Context, id string, timeout time.Duration, flags []string, args ...string) error {
	log, err := os.OpenFile(d.boxes.boxPath(id, logFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("gvisor: open runsc log: %w", err)
	}
	defer log.Close()
	fmt.Fprintf(log, "--- %s runsc %s\n", time.Now().UTC().Format(time.RFC3339Nano), strings.Join(args, " "))
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.opts.Runsc, append(append([]string{}, flags...), args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runsc %s: %w (log: %s)", args[0], err, d.logTail(id, 600))
	}
	return nil
}

// logTail returns about the last n bytes of the box's runsc log, on one line.
func (d *Driver) logTail(id string, n int64) string {
	s := strings.TrimSpace(string(d.readLogTail(id, n)))
	return strings.Join(strings.Fields(s), " ")
}

// readLogTail returns the last n bytes (at most) of the box's runsc log; nil when it has none.
func (d *Driver) readLogTail(id string, n int64) []byte {
	f, err := os.Open(d.boxes.boxPath(id, logFile))
	if err != nil {
		return nil
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil
	}
	off := max(st.Size()-n, 0)
	b := make([]byte, st.Size()-off)
	k, _ := f.ReadAt(b, off)
	return b[:k]
}

// containerState is what the driver reads of runsc's state file of a container
// (<root>/<id>_sandbox:<id>.state, runsc's container.Container as JSON).
type containerState struct {
	ID       string        `json:"id"`
	Status   string        `json:"status"`
	GoferPid int           `json:"goferPid"`
	Sandbox  *stateSandbox `json:"sandbox"`
}

type stateSandbox struct {
	Pid    int `json:"pid"`
	Cgroup struct {
		V1 *struct {
			Name string `json:"name"`
		} `json:"cgroupv1"`
		V2 *struct {
			Path string `json:"path"`
		} `json:"cgroupv2"`
	} `json:"cgroup"`
}

func (s *containerState) sandboxPid() int {
	if s.Sandbox == nil {
		return 0
	}
	return s.Sandbox.Pid
}

func (s *containerState) cgroupName() string {
	if s.Sandbox != nil && s.Sandbox.Cgroup.V1 != nil && s.Sandbox.Cgroup.V1.Name != "" {
		return s.Sandbox.Cgroup.V1.Name
	}
	if s.Sandbox != nil && s.Sandbox.Cgroup.V2 != nil && s.Sandbox.Cgroup.V2.Path != "" {
		return s.Sandbox.Cgroup.V2.Path
	}
	return cgroupPath(s.ID)
}

func (d *Driver) stateFile(id string) string {
	return filepath.Join(d.rootDir, id+"_sandbox:"+id+".state")
}

// readState reads the container's state straight from runsc's state file. This is the cheap
// path of Get and List (no runsc process, no call into the sandbox): `runsc state` asks the
// sandbox over its control socket and falls back to kill(pid, 0), which a zombie passes, so
// it keeps saying "running" after an OOM kill until the zombie is reaped, and then forgets
// the sandbox's pid. The state file keeps the pid. The exact file name is used, so runsc's
// prefix matching of ids never applies. exists is false when there is no container.
func (d *Driver) readState(ctx context.Context, id string) (st containerState, exists bool, err error) {
	for attempt := 0; ; attempt++ {
		b, err := os.ReadFile(d.stateFile(id))
		if errors.Is(err, fs.ErrNotExist) {
			return st, false, nil
		}
		if err != nil {
			return st, false, fmt.Errorf("gvisor: read runsc state of %s: %w", id, err)
		}
		// runsc rewrites the file in place (truncate + write), so a read can catch it half
		// written: retry briefly.
		st = containerState{}
		if err := json.Unmarshal(b, &st); err == nil && st.ID == id && st.Status != "" {
			return st, true, nil
		}
		if attempt == 3 {
			return d.runscState(ctx, id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// runscState is the fallback of readState when the state file cannot be understood (a runsc
// whose file format changed): the OCI state from `runsc state`.
func (d *Driver) runscState(ctx context.Context, id string) (containerState, bool, error) {
	var st containerState
	flags, err := d.containerFlags(id)
	if err != nil {
		return st, false, err
	}
	out, err := d.runsc(ctx, flags, "state", id)
	if err != nil {
		if _, serr := os.Stat(d.stateFile(id)); errors.Is(serr, fs.ErrNotExist) {
			return st, false, nil
		}
		return st, false, err
	}
	var oci struct {
		ID     string `json:"id"`
		Status string `json:"status"`
		Pid    int    `json:"pid"`
	}
	if err := json.Unmarshal(out, &oci); err != nil || oci.ID != id {
		return st, false, fmt.Errorf("gvisor: unexpected runsc state of %s: %q", id, out)
	}
	st.ID, st.Status = oci.ID, oci.Status
	st.Sandbox = &stateSandbox{Pid: oci.Pid}
	return st, true, nil
}

// processAlive reports whether pid is a live (not zombie) runsc sandbox process of box id.
// The command line check guards against pid reuse after the sandbox was reaped.
func processAlive(pid int, id string) bool {
	if pid <= 0 {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state is the first field after the command name, which is in parentheses and
	// may itself contain spaces or parentheses.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return false
	}
	switch stat[i+2] {
	case 'Z', 'X', 'x':
		return false
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if len(args) == 0 || !strings.HasPrefix(args[0], "runsc-sandbox") {
		return false
	}
	for _, a := range args[1:] {
		if a == id {
			return true
		}
	}
	return false
}

// observe is what the driver sees of a box's compute: its phase and, when failed, why.
func (d *Driver) observe(ctx context.Context, id string) (runtime.Phase, string, error) {
	if reason, err := os.ReadFile(d.boxes.boxPath(id, tamperedFile)); err == nil {
		return runtime.PhaseFailed, string(reason), nil
	}
	if d.teardowns.Pending(id) {
		// A checkpoint ended its processes; runsc's state is being deleted (teardown.go).
		return runtime.PhaseStopped, "", nil
	}
	st, exists, err := d.readState(ctx, id)
	if err != nil {
		return "", "", err
	}
	if !exists {
		return runtime.PhaseStopped, "", nil
	}
	alive := processAlive(st.sandboxPid(), id)
	switch {
	case st.Status == "running" && alive:
		if _, err := os.Stat(d.boxes.boxPath(id, channelKeyName)); errors.Is(err, fs.ErrNotExist) {
			// Started by a sandboxd from before channel keys: nothing can prove its init.
			return runtime.PhaseFailed, "the sandbox was started by an older sandboxd, whose control channel cannot be checked; start it again", nil
		}
		return runtime.PhaseRunning, "", nil
	case st.Status == "creating" || st.Status == "created":
		// The driver never leaves a container so: a create or start is running right now
		// (another goroutine or process) or was interrupted (the next Start cleans it up).
		return runtime.PhaseFailed, fmt.Sprintf("container is %q, not started (a create or start in progress or interrupted)", st.Status), nil
	case !alive:
		return runtime.PhaseFailed, d.deathReason(id, st), nil
	case st.Status == "stopped":
		return runtime.PhaseFailed, "the guest init exited (the sandbox process is still up)", nil
	default: // "paused": the driver never pauses
		return runtime.PhaseFailed, fmt.Sprintf("container is %q, not running", st.Status), nil
	}
}

// deathReason says, as far as the host can tell, why a box's sandbox process is gone.
func (d *Driver) deathReason(id string, st containerState) string {
	if n, limit, ok := oomKills(st.cgroupName()); ok && n > 0 {
		if limit > 0 && limit < 1<<50 {
			return fmt.Sprintf("sandbox process exited: out of memory (the memory cgroup OOM-killed it; limit %d MiB)", limit>>20)
		}
		return "sandbox process exited: out of memory (the memory cgroup OOM-killed it)"
	}
	// A sandbox also ends when its PID 1 (the guest init) exits or is killed from inside.
	reason := "sandbox process exited unexpectedly (killed, crashed, or its guest init exited; no OOM kill was counted)"
	if st.sandboxPid() <= 0 {
		reason = "sandbox process is gone (no OOM kill was counted)"
	}
	if line := d.lastErrorLine(id); line != "" {
		reason += "; runsc.log: " + line
	}
	return reason
}

// lastErrorLine returns the last line of the box's runsc log (its tail) that reports an
// error, panic or fatal condition, shortened; "" when there is none.
func (d *Driver) lastErrorLine(id string) string {
	lines := strings.Split(string(d.readLogTail(id, 16<<10)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		low := strings.ToLower(l)
		if strings.Contains(low, "level=info") || strings.HasPrefix(l, "---") {
			continue
		}
		for _, w := range []string{"error", "panic", "fatal", "fail"} {
			if strings.Contains(low, w) {
				if len(l) > 300 {
					l = l[:300] + "…"
				}
				return l
			}
		}
	}
	return ""
}

// cgroupRoot is where the host's cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// oomKills reads the OOM-kill counter of a box's memory cgroup (cgroup v1 memory.oom_control,
// else v2 memory.events) and its limit. The cgroup outlives the sandbox until runsc delete.
func oomKills(name string) (kills, limit int64, ok bool) {
	name = strings.TrimPrefix(filepath.Clean("/"+name), "/")
	if name == "" {
		return 0, 0, false
	}
	v1 := filepath.Join(cgroupRoot, "memory", name)
	if b, err := os.ReadFile(filepath.Join(v1, "memory.oom_control")); err == nil {
		kills, ok = fieldValue(b, "oom_kill")
		if l, err := os.ReadFile(filepath.Join(v1, "memory.limit_in_bytes")); err == nil {
			limit, _ = strconv.ParseInt(strings.TrimSpace(string(l)), 10, 64)
		}
		return kills, limit, ok
	}
	for _, v2 := range []string{filepath.Join(cgroupRoot, name), filepath.Join(cgroupRoot, "unified", name)} {
		if b, err := os.ReadFile(filepath.Join(v2, "memory.events")); err == nil {
			kills, ok = fieldValue(b, "oom_kill")
			if l, err := os.ReadFile(filepath.Join(v2, "memory.max")); err == nil {
				limit, _ = strconv.ParseInt(strings.TrimSpace(string(l)), 10, 64)
			}
			return kills, limit, ok
		}
	}
	return 0, 0, false
}

// fieldValue finds "key value" in a cgroup key/value file.
func fieldValue(b []byte, key string) (int64, bool) {
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == key {
			n, err := strconv.ParseInt(f[1], 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// destroyContainer ends a box's container: delete -force, then the leftovers runsc does
// not always clean (the box's cgroups; the shared null-netns mount once no container is left).
// It is idempotent and a no-op when there is no container. It waits first for the background
// deletion a pause started (teardown.go).
func (d *Driver) destroyContainer(ctx context.Context, id string) error {
	d.teardownGates.release(id)
	if err := d.teardowns.Wait(ctx, id); err != nil {
		return err
	}
	return d.destroyContainerNow(ctx, id)
}

// destroyContainerNow is destroyContainer without the wait: the teardown's own steps.
func (d *Driver) destroyContainerNow(ctx context.Context, id string) error {
	d.spares.Drop(id)
	st, exists, err := d.readState(ctx, id)
	if err != nil {
		return err
	}
	cgroup := cgroupPath(id)
	if exists {
		cgroup = st.cgroupName()
		flags, err := d.containerFlags(id)
		if err != nil {
			return err
		}
		// delete -force kills the sandbox itself; a `runsc kill … KILL` first doubles the
		// cost of a stop (about 100 ms each here) for nothing, so it is only the fallback.
		if _, err := d.runsc(ctx, flags, "delete", "-force", id); err != nil {
			d.log.Warn("runsc delete failed, killing first", "box", id, "err", err)
			if _, kerr := d.runsc(ctx, flags, "kill", id, "KILL"); kerr != nil {
				d.log.Debug("runsc kill", "box", id, "err", kerr)
			}
			if _, err := d.runsc(ctx, flags, "delete", "-force", id); err != nil {
				if _, serr := os.Stat(d.stateFile(id)); !errors.Is(serr, fs.ErrNotExist) {
					return fmt.Errorf("gvisor: delete container %s: %w", id, err)
				}
			}
		}
		d.log.Debug("container deleted", "box", id)
	}
	removeCgroups(cgroup)
	d.cleanSharedMounts()
	return d.net.down(id)
}

// removeCgroups removes a box's cgroup folders in every hierarchy where runsc left them (it
// does after a killed run). rmdir only succeeds on an empty cgroup, so this never affects a
// live box.
func removeCgroups(name string) {
	name = strings.TrimPrefix(filepath.Clean("/"+name), "/")
	if name == "" || strings.Contains(name, "..") {
		return
	}
	hiers, err := os.ReadDir(cgroupRoot)
	if err != nil {
		return
	}
	dirs := []string{filepath.Join(cgroupRoot, name)}
	for _, h := range hiers {
		if h.IsDir() {
			dirs = append(dirs, filepath.Join(cgroupRoot, h.Name(), name))
		}
	}
	for _, dir := range dirs {
		if err := syscall.Rmdir(dir); err != nil && !errors.Is(err, syscall.ENOENT) {
			continue
		}
	}
}

// nullNetNS is runsc's shared "null" network namespace pin in its root folder: on a create that
// finds none, runsc starts the gofer in a new empty network namespace and bind-mounts it there
// for later gofers to join, and never unmounts it.
func (d *Driver) nullNetNS() string { return filepath.Join(d.rootDir, "null-netns") }

// nullNetNSPinned reports whether the null-netns pin is mounted (an nsfs file).
func (d *Driver) nullNetNSPinned() bool {
	var st unix.Statfs_t
	return unix.Statfs(d.nullNetNS(), &st) == nil && st.Type == unix.NSFS_MAGIC
}

// lockForCreate is held around `runsc create`. Creates run in parallel while the null-netns
// pin is there; without it, one create runs alone, so that exactly one pins it: runsc pins a
// namespace in every create that finds none, so parallel first creates stacked one mount each.
func (d *Driver) lockForCreate() (unlock func()) {
	d.createMu.RLock()
	if d.nullNetNSPinned() {
		return d.createMu.RUnlock
	}
	d.createMu.RUnlock()
	d.createMu.Lock()
	return d.createMu.Unlock
}

// cleanSharedMounts unmounts runsc's shared null-netns pin (every mount stacked there) and
// removes its file when no container is left, so a stopped server leaves no mount in its state
// folder. The write lock keeps a create of this driver from racing the unmount; a container
// that runs keeps the pin (later creates join its namespace).
func (d *Driver) cleanSharedMounts() {
	d.createMu.Lock()
	defer d.createMu.Unlock()
	matches, _ := filepath.Glob(filepath.Join(d.rootDir, "*.state"))
	if len(matches) > 0 {
		return
	}
	path := d.nullNetNS()
	for range 64 {
		if !d.nullNetNSPinned() {
			break
		}
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
			d.log.Warn("unmounting runsc's null-netns", "path", path, "err", err)
			return
		}
	}
	if !d.nullNetNSPinned() {
		// An empty file left there makes the next create log a warning and pin again.
		_ = os.Remove(path)
	}
}

// limitedBuffer keeps the first max bytes written to it and drops the rest.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
