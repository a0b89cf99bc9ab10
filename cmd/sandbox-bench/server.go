package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"debug/buildinfo"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ---- components ----

// cacheDir is where the setup scripts keep what they build (scripts/lib.sh).
func cacheDir() string {
	if v := os.Getenv("SANDBOXD_CACHE"); v != "" {
		return v
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ".cache/sandboxd"
	}
	return filepath.Join(home, ".cache", "sandboxd")
}

// defaultRunsc is the path scripts/ensure-runsc.sh prints: the newest runsc under the cache.
func defaultRunsc() string {
	if v := os.Getenv("SANDBOXD_RUNSC"); v != "" {
		return v
	}
	return newest(filepath.Join(cacheDir(), "runsc", "*", "runsc"), "")
}

// defaultRootfs is the path scripts/ensure-rootfs.sh prints: the newest complete rootfs of
// the default profile under the cache.
func defaultRootfs() string {
	if v := os.Getenv("SANDBOXD_ROOTFS"); v != "" {
		return v
	}
	return newest(filepath.Join(cacheDir(), "rootfs", "sandboxes-default-*"), ".sbx-complete")
}

func defaultInit() string {
	if v := os.Getenv("SANDBOXD_INIT"); v != "" {
		return v
	}
	return filepath.Join(cacheDir(), "bin", "sandbox-init")
}

// newest returns the most recently modified match of pattern (that holds marker, when set),
// or "" when there is none.
func newest(pattern, marker string) string {
	matches, _ := filepath.Glob(pattern)
	best, bestTime := "", time.Time{}
	for _, m := range matches {
		fi, err := os.Stat(filepath.Join(m, marker))
		if err != nil {
			continue
		}
		if best == "" || fi.ModTime().After(bestTime) {
			best, bestTime = m, fi.ModTime()
		}
	}
	return best
}

// checkFile fails unless path exists, naming the script that makes it.
func checkFile(what, path, script string) error {
	if path == "" {
		return fmt.Errorf("%s not found: run %s (or pass its flag)", what, script)
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("%s %s: %w (run %s, or pass its flag)", what, path, err, script)
	}
	return nil
}

// ---- the machine ----

func machineInfo(runsc, tmp string) Machine {
	m := Machine{CPUs: goruntime.NumCPU(), Go: goruntime.Version()}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.ParseUint(f[1], 10, 64)
				m.MemoryBytes = kb << 10
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.Runsc = runscVersion(runsc)
	m.TempFS = fsType(tmp)
	return m
}

// loadAvg is the 1-minute load average ("" when unknown).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// runscVersion is `runsc --version`'s first line, or, for a runsc built with go install
// (which says VERSION_MISSING), the module version from its build info.
func runscVersion(runsc string) string {
	if runsc == "" {
		return "unknown"
	}
	out, _ := exec.Command(runsc, "--version").Output()
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	v := strings.TrimSpace(strings.TrimPrefix(line, "runsc version"))
	if v == "" || strings.Contains(v, "VERSION_MISSING") {
		if bi, err := buildinfo.ReadFile(runsc); err == nil && bi.Main.Version != "" {
			return bi.Main.Path + "@" + bi.Main.Version
		}
	}
	if v == "" {
		return "unknown"
	}
	return v
}

// fsType names the file system of path, for the common ones.
func fsType(path string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return ""
	}
	switch uint32(st.Type) {
	case 0x01021994:
		return "tmpfs"
	case 0xEF53:
		return "ext4"
	case 0x58465342:
		return "xfs"
	case 0x9123683E:
		return "btrfs"
	case 0x794C7630:
		return "overlayfs"
	default:
		return fmt.Sprintf("fs 0x%x", uint32(st.Type))
	}
}

// ---- sandboxd ----

// server is a sandboxd process this run started.
type server struct {
	url      string
	key      string
	stateDir string
	logPath  string
	cmd      *exec.Cmd
	done     chan struct{}
	waitErr  error
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// startServer starts sandboxd on a free loopback port over a state folder under dir, with a
// generated development key, its embedded Redis and its log in dir, and waits until /readyz
// answers 200.
func startServer(ctx context.Context, o *options, dir string) (*server, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	s := &server{url: "http://" + addr, key: "bench-" + randomHex(16), stateDir: filepath.Join(dir, "state"),
		logPath: filepath.Join(dir, "sandboxd.log"), done: make(chan struct{})}
	logFile, err := os.Create(s.logPath)
	if err != nil {
		return nil, err
	}
	// Each exec's output stream keeps 64 MiB (the default is 16 MiB): a throughput reader that
	// lags the command by more than the bound would get a truncated event, which fails the run.
	// The subscriptions suite opens all its subscriptions with one key: the replica's total and
	// the project's share are raised to hold them (and the warm-up's).
	subs := max(1000, o.subs+100)
	cfg := fmt.Sprintf("execs:\n  stream_max_bytes: 67108864\nmax_subscriptions: %d\nmax_streams_per_project: %d\n", subs, subs)
	// The default profile as sandboxd defines it, and the same with egress (the network suite).
	cfg += fmt.Sprintf("profiles:\n"+
		"  - {name: %s, milli_cpu: 1000, memory_mb: 1024, disk_mb: 10240}\n"+
		"  - {name: %s, milli_cpu: 1000, memory_mb: 1024, disk_mb: 10240, network: egress, egress_allow: [198.18.0.0/15]}\n",
		benchProfile, benchEgressProfile)
	if o.warmProfile {
		// The warm suite's profile: the default one with a warm pool (kept booted only when
		// the suite runs).
		cfg += fmt.Sprintf("  - {name: %s, milli_cpu: 1000, memory_mb: 1024, disk_mb: 10240, warm_pool: %d}\n", benchWarmProfile, o.warmPool)
	}
	cfgPath := filepath.Join(dir, "sandboxd.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	args := []string{"--config", cfgPath, "--listen", addr, "--state-dir", s.stateDir,
		"--runsc", o.runsc, "--init-binary", o.initBin, "--rootfs", o.rootfs}
	s.cmd = exec.Command(o.sandboxd, args...)
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == "REDIS_URL" || name == "SANDBOX_API_KEY" || strings.HasPrefix(name, "SANDBOXD_") {
			continue
		}
		env = append(env, kv)
	}
	s.cmd.Env = append(env, "SANDBOX_API_KEY="+s.key)
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	// Its own process group: a ^C at the terminal reaches only the benchmark, which then
	// destroys its sandboxes through this server before stopping it.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", o.sandboxd, err)
	}
	go func() {
		s.waitErr = s.cmd.Wait()
		logFile.Close()
		close(s.done)
	}()
	progress("started sandboxd (pid %d) on %s, state in %s", s.cmd.Process.Pid, s.url, s.stateDir)
	deadline := time.Now().Add(90 * time.Second)
	last := ""
	for {
		select {
		case <-s.done:
			return s, fmt.Errorf("sandboxd exited before it was ready (%v); log:\n%s", s.waitErr, s.logTail(40))
		case <-ctx.Done():
			return s, ctx.Err()
		default:
		}
		resp, err := http.Get(s.url + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("sandboxd at %s not ready within 90s (last /readyz: %s); log:\n%s", s.url, last, s.logTail(40))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends SIGTERM to the sandboxd process (SIGKILL after 30 s) and waits for it.
func (s *server) stop() error {
	select {
	case <-s.done:
		return s.waitErr
	default:
	}
	pid := s.cmd.Process.Pid
	_ = syscall.Kill(pid, syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		progress("sandboxd (pid %d) did not exit within 30s of SIGTERM: killing it", pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
		<-s.done
	}
	progress("stopped sandboxd (pid %d)", pid)
	return s.waitErr
}

func (s *server) logTail(lines int) string {
	data, err := os.ReadFile(s.logPath)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// ---- clean-up helpers ----

// runscRoot is the gvisor driver's runsc --root under a sandboxd state folder.
func runscRoot(stateDir string) string { return filepath.Join(stateDir, "runsc-root") }

// leftoverContainers lists the runsc containers under a --root folder.
func leftoverContainers(runsc, root string) ([]string, error) {
	if _, err := os.Stat(root); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	out, err := exec.Command(runsc, "--root", root, "list", "-quiet").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("runsc --root %s list: %v: %s", root, err, out)
	}
	return strings.Fields(string(out)), nil
}

// removeCgroups removes the cgroup folders runsc may leave for container id ("/<id>") in every
// hierarchy; rmdir only succeeds on an empty cgroup.
func removeCgroups(id string) {
	const root = "/sys/fs/cgroup"
	dirs := []string{filepath.Join(root, id)}
	if hiers, err := os.ReadDir(root); err == nil {
		for _, h := range hiers {
			if h.IsDir() {
				dirs = append(dirs, filepath.Join(root, h.Name(), id))
			}
		}
	}
	for _, d := range dirs {
		_ = syscall.Rmdir(d)
	}
}

// mountsUnder lists the mount points below dir, deepest first.
func mountsUnder(dir string) []string {
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil
	}
	var mps []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && strings.HasPrefix(f[1], dir+"/") {
			mps = append(mps, f[1])
		}
	}
	slices.SortFunc(mps, func(a, b string) int { return len(b) - len(a) })
	return mps
}

// unmountUnder detaches every mount below dir (runsc's shared null-netns bind mount in a
// --root folder) and reports whether none is left.
func unmountUnder(dir string) bool {
	for _, mp := range mountsUnder(dir) {
		for i := 0; i < 16 && syscall.Unmount(mp, syscall.MNT_DETACH) == nil; i++ {
		}
	}
	left := mountsUnder(dir)
	for _, mp := range left {
		progress("warning: %s is still mounted", mp)
	}
	return len(left) == 0
}
