package gvisor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sandboxd/runtime"
	"sandboxd/runtime/gvisor"
)

// components are what the tests need from the machine: runsc, the base rootfs and a guest
// init built for the sandbox. missing says why they are not there.
var components struct {
	runsc, rootfs, init string
	missing             string
}

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "sbxinit")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	if err := locate(tmp); err != nil {
		components.missing = err.Error()
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	return code
}

// locate finds runsc and the rootfs (env SANDBOXD_RUNSC / SANDBOXD_ROOTFS, else the setup
// scripts, which build them once per machine) and builds the guest init with CGO_ENABLED=0.
func locate(tmp string) error {
	if os.Geteuid() != 0 {
		return errors.New("the gvisor driver tests need root (runsc)")
	}
	repo, err := repoRoot()
	if err != nil {
		return err
	}
	if components.runsc, err = fromEnvOrScript("SANDBOXD_RUNSC", repo, "scripts/ensure-runsc.sh"); err != nil {
		return err
	}
	if components.rootfs, err = fromEnvOrScript("SANDBOXD_ROOTFS", repo, "scripts/ensure-rootfs.sh"); err != nil {
		return err
	}
	if fi, err := os.Stat(components.runsc); err != nil || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("runsc %q is not an executable file", components.runsc)
	}
	if fi, err := os.Stat(filepath.Join(components.rootfs, "bin", "sh")); err != nil || fi.IsDir() {
		return fmt.Errorf("rootfs %q has no /bin/sh", components.rootfs)
	}
	components.init = filepath.Join(tmp, "sandbox-init")
	build := exec.Command("go", "build", "-o", components.init, "./cmd/sandbox-init")
	build.Dir = repo
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building the guest init: %v: %s", err, out)
	}
	// The spawner program beside it, where the driver finds it (Options.SpawnerBinary).
	spawner := exec.Command(filepath.Join(repo, "scripts", "build-guest-c.sh"), "spawner", filepath.Join(tmp, "sandbox-spawn"))
	spawner.Dir = repo
	if out, err := spawner.CombinedOutput(); err != nil {
		return fmt.Errorf("building the spawner program: %v: %s", err, out)
	}
	return nil
}

func fromEnvOrScript(env, repo, script string) (string, error) {
	if v := os.Getenv(env); v != "" {
		return v, nil
	}
	cmd := exec.Command(filepath.Join(repo, script))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s is unset and %s failed: %v", env, script, err)
	}
	return strings.TrimSpace(string(out)), nil
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// need skips the test when a component is missing, and fails it in CI (CI=true).
func need(t testing.TB) {
	t.Helper()
	if components.missing == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("gvisor driver tests: %s", components.missing)
	}
	t.Skipf("gvisor driver tests skipped (set CI=true to fail instead): %s", components.missing)
}

// defaultSpec is the box most tests use.
func defaultSpec() runtime.BoxSpec {
	return runtime.BoxSpec{
		Profile:     "sandboxes-default",
		Rootfs:      components.rootfs,
		MilliCPU:    1000,
		MemoryBytes: 512 << 20,
		Network:     "none",
		Env:         map[string]string{"SANDBOX_TEST_ENV": "1"},
	}
}

// newDriver returns a driver over a fresh, short StateDir (runsc's control socket lives in
// its root folder and unix socket paths are short). When the test ends it checks that no
// container and no mount is left, then removes the folder.
func newDriver(t testing.TB) *gvisor.Driver {
	t.Helper()
	return newDriverWith(t, gvisor.Options{})
}

// newDriverWith is newDriver with opts (their runsc, state folder, init and logger are the
// test's).
func newDriverWith(t testing.TB, opts gvisor.Options) *gvisor.Driver {
	t.Helper()
	need(t)
	dir, err := os.MkdirTemp("", "sbxg")
	if err != nil {
		t.Fatal(err)
	}
	opts.Runsc, opts.StateDir, opts.InitBinary, opts.Logger = components.runsc, dir, components.init, testLogger()
	d, err := gvisor.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close() // ends the disk pool's refills
		if out, err := exec.Command(components.runsc, "--root="+d.RootDir(), "list", "-quiet").Output(); err != nil {
			t.Errorf("runsc list: %v", err)
		} else if s := strings.TrimSpace(string(out)); s != "" {
			t.Errorf("containers left behind: %q", s)
		}
		if m := mountsUnder(t, dir); len(m) > 0 {
			t.Errorf("mounts left under the state folder: %q", m)
		}
		if t.Failed() {
			t.Logf("state folder kept for inspection: %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	return d
}

func mountsUnder(t testing.TB, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			found = append(found, f[4])
		}
	}
	return found
}

// testLogger logs at debug level when SANDBOXD_TEST_DEBUG is set, else only warnings.
func testLogger() *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("SANDBOXD_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}
