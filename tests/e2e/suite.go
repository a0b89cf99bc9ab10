package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sandboxd/guest/proto"
)

// suite is what TestMain prepares for every test.
var suite struct {
	// modRoot is the module's root folder.
	modRoot string
	// root is the suite's temporary folder: binaries, state folders, configs, logs.
	root string
	// sandboxd and initBin are the built binaries.
	sandboxd string
	initBin  string
	// runsc and rootfs are the gVisor runtime and the base rootfs of the default profile.
	runsc  string
	rootfs string
	// missing says which component is missing (root, runsc, rootfs), nil when none is.
	missing error
	// race says whether sandboxd is built with -race.
	race bool

	mu        sync.Mutex
	stateDirs []string
}

// SuiteOptions are what the test package's TestMain knows and this package cannot.
type SuiteOptions struct {
	// Race says whether the test binary runs with the race detector (a build tag of the test
	// package); sandboxd is then built with -race too, unless SANDBOXD_E2E_RACE=0, so that a
	// data race inside the server fails the test that provoked it.
	Race bool
}

// RunSuite prepares the suite (a temporary folder, the sandboxd and sandbox-init binaries built
// once, the components located), runs the tests with m.Run, checks that no runsc container was
// left behind and returns the exit code. TestMain calls it after flag.Parse:
//
//	os.Exit(e2e.RunSuite(m, e2e.SuiteOptions{Race: raceEnabled}))
func RunSuite(m *testing.M, opts SuiteOptions) int {
	if spec := os.Getenv(netHostEnv); spec != "" {
		// This process is a test host's servers, inside its namespace (nethost.go).
		return serveNetHost(spec)
	}
	suite.race = opts.Race
	root, err := os.MkdirTemp("", "sandboxd-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	suite.root = root
	code := 1
	defer func() {
		unmountUnder(root)
		if code == 0 && os.Getenv("SANDBOXD_E2E_KEEP") == "" {
			os.RemoveAll(root)
		} else {
			fmt.Fprintf(os.Stderr, "e2e: kept %s (server logs, configs, state folders) for inspection\n", root)
		}
	}()
	if suite.modRoot, err = moduleRoot(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	if err := buildBinaries(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	suite.missing = findComponents()
	if suite.missing != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", suite.missing)
	}
	code = m.Run()
	if err := checkNoLeftovers(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		code = 1
	}
	return code
}

// moduleRoot is the folder of go.mod (the tests run in the tests/ folder).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod above %s", dir)
		}
	}
}

// buildBinaries builds sandboxd (with -race when the tests run with it, unless
// SANDBOXD_E2E_RACE=0) and the static guest init.
func buildBinaries() error {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("the go tool is not in PATH: %w", err)
	}
	bin := filepath.Join(suite.root, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	suite.sandboxd = filepath.Join(bin, "sandboxd")
	suite.initBin = filepath.Join(bin, "sandbox-init")
	args := []string{"build", "-o", suite.sandboxd}
	if suite.race && os.Getenv("SANDBOXD_E2E_RACE") != "0" {
		args = append(args, "-race")
	}
	builds := []struct {
		args []string
		env  []string
	}{
		{append(args, "./cmd/sandboxd"), nil},
		{[]string{"build", "-o", suite.initBin, "./cmd/sandbox-init"}, []string{"CGO_ENABLED=0"}},
	}
	for _, b := range builds {
		start := time.Now()
		cmd := exec.Command(gobin, b.args...)
		cmd.Dir = suite.modRoot
		cmd.Env = append(os.Environ(), b.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %v\n%s", strings.Join(b.args, " "), err, out)
		}
		if testing.Verbose() {
			fmt.Fprintf(os.Stderr, "e2e: go %s took %s\n", strings.Join(b.args, " "), time.Since(start).Round(time.Millisecond))
		}
	}
	// The spawner program beside the init, where sandboxd finds it (--spawner-binary).
	cmd := exec.Command(filepath.Join(suite.modRoot, "scripts", "build-guest-c.sh"), "spawner", filepath.Join(bin, "sandbox-spawn"))
	cmd.Dir = suite.modRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the spawner program: %v\n%s", err, out)
	}
	return nil
}

// findComponents locates runsc and the rootfs (from the environment, else from the setup
// scripts). It returns what is missing.
func findComponents() error {
	if os.Geteuid() != 0 {
		return errors.New("the end-to-end tests need root (runsc does): run scripts/test.sh with sudo")
	}
	var err error
	if suite.runsc, err = component("SANDBOXD_RUNSC", "ensure-runsc.sh"); err != nil {
		return err
	}
	if suite.rootfs, err = component("SANDBOXD_ROOTFS", "ensure-rootfs.sh", "sandboxes-default"); err != nil {
		return err
	}
	return nil
}

func component(env, script string, args ...string) (string, error) {
	if v := os.Getenv(env); v != "" {
		if _, err := os.Stat(v); err != nil {
			return "", fmt.Errorf("%s=%s: %w", env, v, err)
		}
		return v, nil
	}
	cmd := exec.Command(filepath.Join(suite.modRoot, "scripts", script), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s is not set and scripts/%s failed: %v\n%s", env, script, err, stderr.String())
	}
	path := strings.TrimSpace(string(out))
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("scripts/%s printed %q: %w", script, path, err)
	}
	return path, nil
}

// RequireComponents skips t when a component is missing, or fails it under CI=true.
func RequireComponents(t testing.TB) {
	t.Helper()
	if suite.missing == nil {
		return
	}
	if InCI() {
		t.Fatalf("a component of the end-to-end tests is missing (CI=true makes this a failure): %v", suite.missing)
	}
	t.Skipf("skipping: a component of the end-to-end tests is missing (under CI=true this fails): %v", suite.missing)
}

// InCI says whether the tests run under CI=true, where a missing component is a failure.
func InCI() bool {
	v := os.Getenv("CI")
	return v != "" && v != "false" && v != "0"
}

// checkNoLeftovers fails the suite when a runsc container outlived the tests in any state folder,
// and removes those containers.
func checkNoLeftovers() error {
	suite.mu.Lock()
	dirs := append([]string(nil), suite.stateDirs...)
	suite.mu.Unlock()
	var problems []string
	for _, dir := range dirs {
		ids, err := LeftoverContainers(dir)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		if len(ids) > 0 {
			problems = append(problems, fmt.Sprintf("runsc containers %v left in %s", ids, runscRoot(dir)))
			forceDelete(dir, ids)
		}
	}
	if len(problems) > 0 {
		return errors.New("after the tests: " + strings.Join(problems, "; "))
	}
	return nil
}

// ModuleRoot is the module's root folder (where go.mod is).
func ModuleRoot() string { return suite.modRoot }

// Rootfs is the base rootfs of the default profile.
func Rootfs() string { return suite.rootfs }

// runscRoot is runsc's --root folder of the gvisor driver under a state folder.
func runscRoot(stateDir string) string { return filepath.Join(stateDir, "runsc-root") }

// Runsc runs runsc on the containers of a state folder's servers (a sandbox's container is
// named by its id) and returns its output.
func Runsc(t testing.TB, stateDir string, args ...string) string {
	t.Helper()
	out, err := exec.Command(suite.runsc, append([]string{"--root", runscRoot(stateDir)}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("runsc %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// RunOverExecLogs runs script (sh -c) in sandbox id's box as only the host can: `runsc exec`
// with CAP_SYS_ADMIN, in a mount namespace of its own where the guest init's state folder (the
// exec logs, which PID 1 hides from the box's commands) is uncovered. It returns the output.
func RunOverExecLogs(t testing.TB, stateDir, id, script string) string {
	t.Helper()
	return Runsc(t, stateDir, "exec", "--cap", "CAP_SYS_ADMIN", id, "unshare", "-m", "sh", "-c",
		"umount "+proto.StateDir+" && "+script)
}

// LeftoverContainers lists the runsc containers under a state folder.
func LeftoverContainers(stateDir string) ([]string, error) {
	root := runscRoot(stateDir)
	if _, err := os.Stat(root); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	out, err := exec.Command(suite.runsc, "--root", root, "list", "-quiet").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("runsc --root %s list: %v: %s", root, err, out)
	}
	return strings.Fields(string(out)), nil
}

// forceDelete removes containers a test left behind, so that one failure does not leak boxes,
// and the mounts runsc leaves in its root folder.
func forceDelete(stateDir string, ids []string) {
	for _, id := range ids {
		out, err := exec.Command(suite.runsc, "--root", runscRoot(stateDir), "delete", "-force", id).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e: runsc delete -force %s: %v: %s\n", id, err, out)
		}
	}
	unmountUnder(stateDir)
}

// unmountUnder detaches every mount below dir (runsc's shared null-netns bind mount in its root
// folder outlives a container that was not deleted through the driver).
func unmountUnder(dir string) {
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		if mp := fields[1]; strings.HasPrefix(mp, dir+"/") {
			if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil {
				fmt.Fprintf(os.Stderr, "e2e: unmount %s: %v\n", mp, err)
			}
		}
	}
}

// Sandboxd is the sandboxd binary the suite built.
func Sandboxd() string { return suite.sandboxd }
