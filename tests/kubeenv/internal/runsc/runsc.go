// Package runsc drives the runsc (gVisor) command line for the test cluster's node: one
// runsc container per Kubernetes container, in a runsc --root of the node's own.
//
// It follows what the project's local driver learned on these machines
// (runtime/gvisor/runsc.go and shared/docs/gvisor-notes.md):
//   - global flags must be identical on every call for a container, so a CLI value carries
//     them and every call goes through it;
//   - create/start keep their stdio open in the sandbox: they get a log file, never a pipe;
//   - a container's liveness is its sandbox pid (from runsc's state file) alive in /proc, not
//     `runsc state`, which keeps saying "running" after the sandbox was OOM-killed;
//   - container ids are matched by prefix, so callers use fixed-length ids;
//   - runsc leaves a "null-netns" mount in the root folder and cgroups of killed sandboxes;
//   - `runsc wait` cannot report the exit status of a root container whose sandbox is already
//     gone (a fast exit, a kill): only the sandbox's parent can, see package shim.
package runsc

import (
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
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CLI runs runsc with one --root and one set of global flags.
type CLI struct {
	// Path is the runsc binary.
	Path string
	// Root is runsc's --root (state files of the containers).
	Root string
	// Flags are the other global flags (--platform, --network, --overlay2, …), identical on
	// every call.
	Flags []string
}

// MaxIDLen is the longest container id the node uses (see RootFor).
const MaxIDLen = 32

// maxSocketPath is the longest path of a unix socket (sun_path holds 108 bytes with the NUL).
const maxSocketPath = 107

// RootFor returns the runsc --root of a node whose state lives in dataDir: dataDir/runsc-root,
// unless that is too long for the control socket runsc makes there for every container
// (<root>/runsc-<id>.sock, ids of up to MaxIDLen characters); then a short folder named by a
// hash of dataDir under /run/kubeenv.
func RootFor(dataDir string) string {
	root := filepath.Join(dataDir, "runsc-root")
	if len(root)+len("/runsc-")+MaxIDLen+len(".sock") <= maxSocketPath {
		return root
	}
	sum := sha256.Sum256([]byte(filepath.Clean(dataDir)))
	return filepath.Join("/run/kubeenv", hex.EncodeToString(sum[:])[:16])
}

// cliTimeout bounds one short runsc command.
const cliTimeout = 30 * time.Second

// args returns the global flags followed by args.
func (c *CLI) args(args ...string) []string {
	out := make([]string, 0, 1+len(c.Flags)+len(args))
	out = append(out, "--root="+c.Root)
	out = append(out, c.Flags...)
	return append(out, args...)
}

// Command returns an exec.Cmd of runsc with the global flags and args, for callers that wire
// the stdio themselves (exec).
func (c *CLI) Command(args ...string) *exec.Cmd {
	return exec.Command(c.Path, c.args(args...)...)
}

// Run runs one short runsc command (never create, start or exec, whose sandbox may keep the
// stdio open) and returns its stdout; errors carry its stderr.
func (c *CLI) Run(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Path, c.args(args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("runsc %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// RunLogged runs runsc create or start with its stdio on log: the sandbox inherits them and
// keeps them open, so they must never be a pipe read to EOF. log should be opened O_APPEND.
func (c *CLI) RunLogged(ctx context.Context, log *os.File, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Path, c.args(args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runsc %s: %w (see %s)", args[0], err, log.Name())
	}
	return nil
}

// State is what is read of runsc's state file of a container (runsc's container.Container).
type State struct {
	ID      string `json:"id"`
	Status  string `json:"status"`
	Sandbox *struct {
		Pid    int `json:"pid"`
		Cgroup struct {
			V1 *struct {
				Name string `json:"name"`
			} `json:"cgroupv1"`
			V2 *struct {
				Path string `json:"path"`
			} `json:"cgroupv2"`
		} `json:"cgroup"`
	} `json:"sandbox"`
}

// SandboxPid is the pid of the container's sandbox process, 0 when unknown.
func (s *State) SandboxPid() int {
	if s.Sandbox == nil {
		return 0
	}
	return s.Sandbox.Pid
}

// Cgroup is the container's cgroup path as runsc recorded it, or fallback.
func (s *State) Cgroup(fallback string) string {
	if s.Sandbox != nil && s.Sandbox.Cgroup.V1 != nil && s.Sandbox.Cgroup.V1.Name != "" {
		return s.Sandbox.Cgroup.V1.Name
	}
	if s.Sandbox != nil && s.Sandbox.Cgroup.V2 != nil && s.Sandbox.Cgroup.V2.Path != "" {
		return s.Sandbox.Cgroup.V2.Path
	}
	return fallback
}

const stateSuffix = ".state"

func (c *CLI) stateFile(id string) string {
	return filepath.Join(c.Root, id+"_sandbox:"+id+stateSuffix)
}

// ReadState reads the container's state file (exact name, so runsc's prefix matching of ids
// never applies). exists is false when there is no container.
func (c *CLI) ReadState(id string) (st State, exists bool, err error) {
	for attempt := 0; ; attempt++ {
		b, err := os.ReadFile(c.stateFile(id))
		if errors.Is(err, fs.ErrNotExist) {
			return st, false, nil
		}
		if err != nil {
			return st, false, fmt.Errorf("read runsc state of %s: %w", id, err)
		}
		// runsc rewrites the file in place (truncate + write): a read can catch it half written.
		st = State{}
		if err := json.Unmarshal(b, &st); err == nil && st.ID == id && st.Status != "" {
			return st, true, nil
		}
		if attempt == 5 {
			return st, true, fmt.Errorf("runsc state of %s: cannot parse %s", id, c.stateFile(id))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Alive reports whether container id has a live (not zombie) sandbox process.
func (c *CLI) Alive(id string) bool {
	st, exists, err := c.ReadState(id)
	if err != nil || !exists {
		return false
	}
	return ProcessAlive(st.SandboxPid(), id)
}

// ProcessAlive reports whether pid is a live (not zombie) runsc sandbox process of container
// id. The command line check guards against pid reuse.
func ProcessAlive(pid int, id string) bool {
	if pid <= 0 {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may contain anything.
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

// IDs lists the containers that have a state file in the root folder.
func (c *CLI) IDs() ([]string, error) {
	entries, err := os.ReadDir(c.Root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list runsc root %s: %w", c.Root, err)
	}
	var ids []string
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, stateSuffix) {
			continue
		}
		if i := strings.Index(name, "_sandbox:"); i > 0 {
			ids = append(ids, name[:i])
		}
	}
	return ids, nil
}

// Destroy ends container id: `delete -force` (which kills the sandbox), `kill … KILL` first
// only when that fails, then the cgroups runsc may leave. Idempotent; a no-op without a
// container. cgroup is the container's cgroupsPath (used when the state file has none).
func (c *CLI) Destroy(ctx context.Context, id, cgroup string) error {
	st, exists, _ := c.ReadState(id)
	if exists {
		cgroup = st.Cgroup(cgroup)
		if _, err := c.Run(ctx, "delete", "-force", id); err != nil {
			_, _ = c.Run(ctx, "kill", id, "KILL")
			if _, err := c.Run(ctx, "delete", "-force", id); err != nil {
				if _, serr := os.Stat(c.stateFile(id)); !errors.Is(serr, fs.ErrNotExist) {
					return fmt.Errorf("delete runsc container %s: %w", id, err)
				}
			}
		}
	}
	RemoveCgroups(cgroup)
	return nil
}

// DestroyAll destroys every container of the root folder and, once none is left, unmounts
// runsc's shared null-netns mount there. It returns the ids it destroyed.
func (c *CLI) DestroyAll(ctx context.Context) ([]string, error) {
	ids, err := c.IDs()
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, id := range ids {
		if err := c.Destroy(ctx, id, "/"+id); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		c.UnmountShared()
	}
	return ids, errors.Join(errs...)
}

// UnmountShared unmounts runsc's "null-netns" nsfs bind mount in the root folder when no
// container is left (runsc mounts it on the first create and never unmounts it).
func (c *CLI) UnmountShared() {
	if ids, err := c.IDs(); err != nil || len(ids) > 0 {
		return
	}
	path := filepath.Join(c.Root, "null-netns")
	for range 16 {
		if err := syscall.Unmount(path, syscall.MNT_DETACH); err != nil {
			break
		}
	}
}

// CgroupRoot is where the host's cgroup hierarchies are mounted.
const CgroupRoot = "/sys/fs/cgroup"

// RemoveCgroups removes a container's cgroup folders in every hierarchy where runsc left them.
// rmdir only succeeds on an empty cgroup, so it never affects a live container.
func RemoveCgroups(name string) {
	name = strings.TrimPrefix(filepath.Clean("/"+name), "/")
	if name == "" || strings.Contains(name, "..") {
		return
	}
	hiers, err := os.ReadDir(CgroupRoot)
	if err != nil {
		return
	}
	dirs := []string{filepath.Join(CgroupRoot, name)}
	for _, h := range hiers {
		if h.IsDir() {
			dirs = append(dirs, filepath.Join(CgroupRoot, h.Name(), name))
		}
	}
	for _, dir := range dirs {
		_ = syscall.Rmdir(dir)
	}
}

// OOMKills reads the OOM-kill counter of a memory cgroup (cgroup v1 memory.oom_control, else
// v2 memory.events). The cgroup outlives the sandbox until runsc delete.
func OOMKills(name string) (int64, bool) {
	name = strings.TrimPrefix(filepath.Clean("/"+name), "/")
	if name == "" {
		return 0, false
	}
	files := []string{
		filepath.Join(CgroupRoot, "memory", name, "memory.oom_control"),
		filepath.Join(CgroupRoot, name, "memory.events"),
		filepath.Join(CgroupRoot, "unified", name, "memory.events"),
	}
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			return fieldValue(b, "oom_kill")
		}
	}
	return 0, false
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

// Version returns the first line of `runsc --version`.
func (c *CLI) Version(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, cliTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, c.Path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("runsc --version: %w", err)
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(line), nil
}

// LogTail returns about the last n bytes of a log file, starting at a line ("" when unreadable).
func LogTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(st.Size()-n, 0)
	b := make([]byte, st.Size()-off)
	k, _ := f.ReadAt(b, off)
	s := string(b[:k])
	if off > 0 {
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
	}
	return s
}

// LogLine is LogTail on one line (for error messages).
func LogLine(path string, n int64) string {
	return strings.Join(strings.Fields(LogTail(path, n)), " ")
}
