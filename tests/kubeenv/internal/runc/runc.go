// Package runc drives Debian's runc (the native OCI runtime, what a real cluster's default
// RuntimeClass runs) for the test cluster's node: pods whose RuntimeClass has handler runc run
// their containers with it, one runc container per Kubernetes container, in a runc --root of
// the node's own.
//
// It mirrors package runsc where the two agree (one CLI value with fixed global flags, the
// same bundle spec, a shim as the parent of the container's process), and does what runc needs
// and runsc did not:
//   - a container's liveness is `runc state` (its JSON pid and status: runc reports a zombie
//     or vanished init as "stopped"), not runsc's state file and sandbox process;
//   - runc writes into the root folder it is given, so every container gets an overlay over
//     the image folder (MountRootfs): writes land in the bundle, the shared image folder is
//     never written (runsc's --overlay2=root:memory does this for gVisor containers);
//   - the container's cgroup is under a cgroup parent of the node (CgroupParentFor), which
//     runc creates and never removes;
//   - the spec gets what a native container needs on top of the node's common spec: the
//     masked and read-only paths and the device cgroup rule of `runc spec` (Complete).
package runc

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sandboxd/tests/kubeenv/internal/runsc"
)

// CLI runs runc with one --root, and puts its containers' cgroups under one parent.
type CLI struct {
	// Path is the runc binary (Debian's: /usr/sbin/runc).
	Path string
	// Root is runc's --root (a folder per container: state.json, exec.fifo).
	Root string
	// CgroupParent is the cgroup (a path from each hierarchy's root) under which the
	// containers' cgroups are made (CgroupParentFor).
	CgroupParent string
}

// DefaultPath is where Debian's runc package installs the binary.
const DefaultPath = "/usr/sbin/runc"

// RootFor returns the runc --root of a node whose state lives in dataDir. runc makes no unix
// socket there (the containers have no terminal), so the path length does not matter.
func RootFor(dataDir string) string { return filepath.Join(dataDir, "runc-root") }

// CgroupParentFor returns the cgroup parent of a node whose state lives in dataDir:
// "/kubeenv-" and a hash of dataDir, so two nodes on a machine never share one and a node's
// leftovers are found again from its folder.
func CgroupParentFor(dataDir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(dataDir)))
	return "/kubeenv-" + hex.EncodeToString(sum[:])[:16]
}

// Cgroup is container id's cgroup path (the spec's cgroupsPath).
func (c *CLI) Cgroup(id string) string { return c.CgroupParent + "/" + id }

// cliTimeout bounds one short runc command.
const cliTimeout = 30 * time.Second

func (c *CLI) args(args ...string) []string {
	return append([]string{"--root=" + c.Root}, args...)
}

// Command returns an exec.Cmd of runc with the global flags and args (exec wires its stdio).
func (c *CLI) Command(args ...string) *exec.Cmd {
	return exec.Command(c.Path, c.args(args...)...)
}

// Run runs one short runc command and returns its stdout; errors carry its stderr.
func (c *CLI) Run(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Path, c.args(args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("runc %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// RunLogged runs runc create or start with its stdio on log. `runc create` hands its own
// stdio to the container's process (no terminal), which keeps them open: they must never be a
// pipe read to EOF. log should be opened O_APPEND.
func (c *CLI) RunLogged(ctx context.Context, log *os.File, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Path, c.args(args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runc %s: %w (see %s)", args[0], err, log.Name())
	}
	return nil
}

// State is what `runc state ID` prints.
type State struct {
	ID     string `json:"id"`
	Pid    int    `json:"pid"`
	Status string `json:"status"` // created, running, paused, stopped
	Bundle string `json:"bundle"`
}

// exists reports whether runc has a container id in its root (exact name: runc ids never
// match by prefix, the check only saves running runc for nothing).
func (c *CLI) exists(id string) bool {
	_, err := os.Stat(filepath.Join(c.Root, id, "state.json"))
	return err == nil
}

// ReadState runs `runc state ID`. exists is false when there is no container.
func (c *CLI) ReadState(ctx context.Context, id string) (st State, exists bool, err error) {
	if !c.exists(id) {
		return st, false, nil
	}
	out, err := c.Run(ctx, "state", id)
	if err != nil {
		if !c.exists(id) {
			return st, false, nil
		}
		return st, true, err
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, true, fmt.Errorf("runc state %s: %w", id, err)
	}
	return st, true, nil
}

// Alive reports whether container id's init process runs: runc's state says created,
// running or paused (runc reports a zombie or vanished init as stopped).
func (c *CLI) Alive(id string) bool {
	st, exists, err := c.ReadState(context.Background(), id)
	if err != nil || !exists || st.Pid <= 0 {
		return false
	}
	return st.Status != "stopped"
}

// IDs lists the containers of the root folder.
func (c *CLI) IDs() ([]string, error) {
	entries, err := os.ReadDir(c.Root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list runc root %s: %w", c.Root, err)
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && c.exists(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// Destroy ends container id: `delete --force` (SIGKILL to its init, whose death ends every
// process of its pid namespace, then its state and cgroups removed), `kill … KILL` first only
// when that fails; then the overlay root of its bundle is unmounted and what runc may leave
// of its cgroups removed. Idempotent; a no-op without a container. bundle is the container's
// bundle folder ("" to take it from runc's state).
func (c *CLI) Destroy(ctx context.Context, id, bundle string) error {
	if c.exists(id) {
		if bundle == "" {
			if st, _, err := c.ReadState(ctx, id); err == nil {
				bundle = st.Bundle
			}
		}
		if _, err := c.Run(ctx, "delete", "--force", id); err != nil {
			_, _ = c.Run(ctx, "kill", id, "KILL")
			if _, err := c.Run(ctx, "delete", "--force", id); err != nil && c.exists(id) {
				return fmt.Errorf("delete runc container %s: %w", id, err)
			}
		}
	}
	var err error
	if bundle != "" {
		err = UnmountRootfs(bundle)
	}
	// runc removes them on delete; after a failed create or a killed runc, rmdir (which
	// only succeeds on an empty cgroup) clears what is left.
	runsc.RemoveCgroups(c.Cgroup(id))
	return err
}

// DestroyAll destroys every container of the root folder, then removes the node's cgroup
// parent once it is empty. It returns the ids it destroyed.
func (c *CLI) DestroyAll(ctx context.Context) ([]string, error) {
	ids, err := c.IDs()
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, id := range ids {
		if err := c.Destroy(ctx, id, ""); err != nil {
			errs = append(errs, err)
		}
	}
	runsc.RemoveCgroups(c.CgroupParent)
	return ids, errors.Join(errs...)
}

// Version returns the first line of `runc --version`.
func (c *CLI) Version(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, cliTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, c.Path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("runc --version: %w", err)
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(line), nil
}

// Folders of a container's bundle that hold its overlay root.
const (
	rootfsDir = "rootfs"
	upperDir  = "upper"
	workDir   = "work"
)

// MountRootfs mounts an overlay of the image folder (lower) and bundle/upper at
// bundle/rootfs and returns that path, the container's root. runc writes into the root it is
// given (the container's writes, the mount points it creates); the image folder is shared by
// every container of that image and must stay as it is.
func MountRootfs(bundle, image string) (string, error) {
	root := filepath.Join(bundle, rootfsDir)
	upper, work := filepath.Join(bundle, upperDir), filepath.Join(bundle, workDir)
	for _, p := range []string{image, upper, work} {
		if strings.ContainsAny(p, ",:\\") {
			return "", fmt.Errorf("overlay root: path %q has a character overlayfs options cannot carry", p)
		}
	}
	fi, err := os.Stat(image)
	if err != nil {
		return "", fmt.Errorf("overlay root: image folder: %w", err)
	}
	for _, d := range []string{root, upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", fmt.Errorf("overlay root: %w", err)
		}
	}
	// The merged root takes the upper folder's owner and mode: make them the image's.
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		_ = os.Chown(upper, int(st.Uid), int(st.Gid))
	}
	_ = os.Chmod(upper, fi.Mode().Perm())
	opts := "lowerdir=" + image + ",upperdir=" + upper + ",workdir=" + work
	if err := syscall.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return "", fmt.Errorf("overlay root at %s: mount: %w", root, err)
	}
	return root, nil
}

// UnmountRootfs unmounts the overlay root of a bundle (MountRootfs); a no-op when it is not
// mounted.
func UnmountRootfs(bundle string) error {
	return unmountAll(filepath.Join(bundle, rootfsDir))
}

// unmountAll unmounts every mount stacked on path.
func unmountAll(path string) error {
	for range 16 {
		err := syscall.Unmount(path, syscall.MNT_DETACH)
		if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOENT) {
			return nil // not (or no longer) a mount point
		}
		if err != nil {
			return fmt.Errorf("unmount %s: %w", path, err)
		}
	}
	return fmt.Errorf("unmount %s: still mounted after 16 unmounts", path)
}

// UnmountUnder unmounts every mount at or below dir (deepest first): the overlay roots of
// containers whose runc state is gone (a node killed between mount and create). Run before
// removing a folder that held bundles, so the removal never goes through a mount.
func UnmountUnder(dir string) error {
	dir = filepath.Clean(dir)
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescapeMountPath(fields[4])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, p := range slices.Compact(points) {
		if err := unmountAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space, …).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// maskedPaths and readonlyPaths are `runc spec`'s defaults (runc 1.1): a native container
// shares the host's kernel, so its /proc and /sys must not expose the host's keys, kernel
// memory or writable sysctls. gVisor's are its own and need none of this.
var (
	maskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
	}
	readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// Complete adds to the node's common spec of container id what runc needs and runsc did
// not: the masked and read-only paths, a device cgroup that denies every device but the
// ones runc always allows (null, zero, full, random, urandom, tty, pts), rlimits no higher
// than the node's own (clampRlimits), the /dev/mqueue
// mount of the container's own IPC namespace, and the cgroup under the node's parent. The
// namespaces (pid, ipc, uts, mount and a new network namespace, where runc brings up only
// the loopback interface) are the common spec's. The pod's seccomp profile (RuntimeDefault)
// is not applied: the node has no seccomp profile to give runc, and the containers run on
// a test machine only.
func (c *CLI) Complete(spec *runsc.Spec, id string) {
	spec.Linux.MaskedPaths = slices.Clone(maskedPaths)
	spec.Linux.ReadonlyPaths = slices.Clone(readonlyPaths)
	if spec.Linux.Resources == nil {
		spec.Linux.Resources = &runsc.Resources{}
	}
	spec.Linux.Resources.Devices = []runsc.DeviceRule{{Allow: false, Access: "rwm"}}
	spec.Linux.CgroupsPath = c.Cgroup(id)
	clampRlimits(spec.Process.Rlimits)
	at := func(dst string) int {
		return slices.IndexFunc(spec.Mounts, func(m runsc.Mount) bool { return m.Destination == dst })
	}
	// Right after the /dev tmpfs (its mount point is there), before the volumes; not when a
	// volume took /dev or /dev/mqueue.
	if i := at("/dev"); i >= 0 && spec.Mounts[i].Type == "tmpfs" && at("/dev/mqueue") < 0 {
		mq := runsc.Mount{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}}
		spec.Mounts = slices.Insert(spec.Mounts, i+1, mq)
	}
}

// rlimitResources maps the rlimits the node sets to their resource numbers.
var rlimitResources = map[string]int{"RLIMIT_NOFILE": syscall.RLIMIT_NOFILE}

// clampRlimits lowers the rlimits to the node's own hard limits. runc sets them on the
// container's process from outside (prlimit), and raising a hard limit needs
// CAP_SYS_RESOURCE, which the node may not have (these machines' root lacks it: nofile stays
// at its 20000). gVisor applies rlimits inside its sandbox and needs no such care.
func clampRlimits(rls []runsc.Rlimit) {
	for i, rl := range rls {
		res, ok := rlimitResources[rl.Type]
		if !ok {
			continue
		}
		var cur syscall.Rlimit
		if err := syscall.Getrlimit(res, &cur); err != nil {
			continue
		}
		rls[i].Hard = min(rl.Hard, cur.Max)
		rls[i].Soft = min(rl.Soft, rls[i].Hard)
	}
}
