package gvisor_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/runtime"
	"sandboxd/runtime/gvisor"
	"sandboxd/runtime/runtimetest"
)

func TestConformance(t *testing.T) {
	need(t)
	runtimetest.Run(t, func(t *testing.T) runtime.Driver { return newDriver(t) }, defaultSpec())
}

// waitPhase polls Get until the box reaches phase.
func waitPhase(t *testing.T, d runtime.Driver, id string, phase runtime.Phase, within time.Duration) runtime.Box {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		b, err := d.Get(ctxT(t), id)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if b.Phase == phase {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("box %s is %s (%s) after %v, want %s", id, b.Phase, b.Reason, within, phase)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestOOMFailsBox(t *testing.T) {
	d := newDriver(t)
	spec := defaultSpec()
	spec.MemoryBytes = 64 << 20
	for _, tc := range []struct {
		name string
		argv []string
	}{
		{"Python", []string{"python3", "-c", "x = bytearray(512 << 20); print(len(x))"}},
		{"Tail", []string{"sh", "-c", "head -c 600M /dev/zero | tail"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := runtimetest.CreateBox(t, d, spec)
			c := runtimetest.Client(t, d, id)
			// The exec dies with the sandbox: the call fails (the attach breaks).
			res, err := c.Run(ctxT(t), proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: tc.argv}, 1<<20, 1<<20)
			t.Logf("exec over the limit: err=%v exit=%+v", err, res.Exit)

			b := waitPhase(t, d, id, runtime.PhaseFailed, 15*time.Second)
			t.Logf("reason: %s", b.Reason)
			if !strings.Contains(b.Reason, "out of memory") {
				t.Errorf("got reason %q, want it to say out of memory", b.Reason)
			}
			if _, err := d.Attach(ctxT(t), id); !errors.Is(err, runtime.ErrNotRunning) {
				t.Errorf("Attach to a crashed box: got %v, want ErrNotRunning", err)
			}
			boxes, err := d.List(ctxT(t))
			if err != nil || len(boxes) != 1 || boxes[0].Phase != runtime.PhaseFailed {
				t.Errorf("List: got %+v, %v, want the box failed", boxes, err)
			}
			// A failed box starts again on its workspace.
			fresh, err := d.Start(ctxT(t), id)
			if err != nil || fresh {
				t.Fatalf("Start after OOM: got (%v, %v), want (false, nil)", fresh, err)
			}
			if b, _ := d.Get(ctxT(t), id); b.Phase != runtime.PhaseRunning || b.Reason != "" {
				t.Errorf("got phase %s (%s) after Start, want running", b.Phase, b.Reason)
			}
			res = runtimetest.MustRun(t, runtimetest.Client(t, d, id), proto.ExecRequest{Argv: []string{"true"}})
			if res.Exit.ExitCode != 0 {
				t.Errorf("got exit %+v after restart, want 0", res.Exit)
			}
			if err := d.Delete(ctxT(t), id); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Crashes that are not OOM kills: the sandbox process killed on the host, and the guest init
// (PID 1) killed from inside, which ends the sandbox too.
func TestSandboxDeathNotOOM(t *testing.T) {
	d := newDriver(t)
	for _, tc := range []struct {
		name string
		kill func(t *testing.T, id string)
	}{
		{"KilledOnHost", func(t *testing.T, id string) {
			pid, err := d.SandboxPid(ctxT(t), id)
			if err != nil || pid <= 0 {
				t.Fatalf("SandboxPid: %d, %v", pid, err)
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}},
		{"InitKilledInside", func(t *testing.T, id string) {
			c := runtimetest.Client(t, d, id)
			_, err := c.Run(ctxT(t), proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: []string{"kill", "-KILL", "1"}}, 1<<10, 1<<10)
			t.Logf("kill -KILL 1: %v", err)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := runtimetest.CreateBox(t, d, defaultSpec())
			tc.kill(t, id)
			b := waitPhase(t, d, id, runtime.PhaseFailed, 10*time.Second)
			t.Logf("reason: %s", b.Reason)
			if !strings.Contains(b.Reason, "sandbox process") || strings.Contains(b.Reason, "out of memory") {
				t.Errorf("got reason %q, want an unexpected exit that is not an OOM", b.Reason)
			}
			if _, err := d.Attach(ctxT(t), id); !errors.Is(err, runtime.ErrNotRunning) {
				t.Errorf("Attach: got %v, want ErrNotRunning", err)
			}
		})
	}
}

// TestInitOutlivesStraySignals: a command in the box sends PID 1 every signal the init can
// catch (among them the ones Go's runtime dies of when a process sends them: SIGHUP, SIGQUIT,
// SIGABRT, SIGSYS, SIGTRAP, SIGILL, SIGSEGV, SIGBUS, SIGFPE, SIGSTKFLT; SIGTSTP, SIGTTIN and
// SIGTTOU, which stopped it; and SIGTERM and SIGINT, with which this runtime never asks the
// init to stop: proto.StopSignalsEnv), each three times; the box runs on and serves the next
// command. Not sent: SIGKILL (TestSandboxDeathNotOOM), and signals 32 and 34, which Go leaves
// at their default action (C libraries reserve them), so that they end PID 1 as SIGKILL does.
func TestInitOutlivesStraySignals(t *testing.T) {
	d := newDriver(t)
	id := runtimetest.CreateBox(t, d, defaultSpec())
	c := runtimetest.Client(t, d, id)
	var sigs []string
	for s := 1; s <= 64; s++ {
		switch syscall.Signal(s) {
		case syscall.SIGKILL, syscall.SIGSTOP, 32, 34:
			continue
		}
		sigs = append(sigs, strconv.Itoa(s))
	}
	script := "for s in " + strings.Join(sigs, " ") + "; do kill -$s 1 && kill -$s 1 && kill -$s 1 || echo refused $s; done; echo sent"
	res := runtimetest.MustRun(t, c, proto.ExecRequest{Argv: []string{"sh", "-c", script}})
	if res.Exit.ExitCode != 0 || !strings.Contains(string(res.Stdout), "sent") || strings.Contains(string(res.Stdout), "refused") {
		t.Fatalf("sending the signals: exit %+v, stdout %q, stderr %q", res.Exit, res.Stdout, res.Stderr)
	}
	time.Sleep(200 * time.Millisecond) // signals are delivered asynchronously
	if res := runtimetest.MustRun(t, c, proto.ExecRequest{Argv: []string{"echo", "still here"}}); string(res.Stdout) != "still here\n" {
		t.Fatalf("after the signals: got %q", res.Stdout)
	}
	if b, err := d.Get(ctxT(t), id); err != nil || b.Phase != runtime.PhaseRunning {
		t.Fatalf("after the signals: phase %v (%s), %v", b.Phase, b.Reason, err)
	}
	// What PID 1 keeps for itself is not what its commands get: each starts with those
	// signals at their default action (none ignored).
	check := "import signal as s; print(all(s.getsignal(g) == s.SIG_DFL for g in (s.SIGHUP, s.SIGQUIT, s.SIGABRT, " +
		"s.SIGSEGV, s.SIGTERM, s.SIGTSTP, s.SIGTTIN, s.SIGTTOU, s.SIGUSR1, s.SIGRTMIN, s.SIGRTMAX)))"
	if res := runtimetest.MustRun(t, c, proto.ExecRequest{Argv: []string{"python3", "-c", check}}); string(res.Stdout) != "True\n" {
		t.Fatalf("a command's signal dispositions: got %q (stderr %q), want all at their default", res.Stdout, res.Stderr)
	}
}

// TestSpawnerInTheBox: the box's commands are started by the spawner program (which the
// driver installs beside the init): each is PID 1's child, in its exec's cgroup, with no
// signal blocked or ignored. What a command can do to the program: not read its descriptors
// or memory (it is not dumpable and a command lacks CAP_SYS_PTRACE); send it any signal
// (all but SIGKILL and SIGSTOP change nothing); and kill it, after which PID 1 starts the
// commands itself until it replaced the program.
func TestSpawnerInTheBox(t *testing.T) {
	d := newDriver(t)
	id := runtimetest.CreateBox(t, d, defaultSpec())
	c := runtimetest.Client(t, d, id)
	health := func() proto.Health {
		t.Helper()
		h, err := c.Health(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	deadline := time.Now().Add(10 * time.Second)
	for health().SpawnerPid == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no spawner program in the box (is sandbox-spawn beside the init?)")
		}
		time.Sleep(20 * time.Millisecond) // PID 1 starts it right after it began to serve
	}
	h := health()
	sp := strconv.Itoa(h.SpawnerPid)

	// $$ is the exec's own process (sh), which the program started.
	res := runtimetest.MustRun(t, c, proto.ExecRequest{Argv: []string{"sh", "-c",
		`grep PPid /proc/$$/status; grep job /proc/$$/cgroup; cat /proc/` + sp + `/comm`}})
	out := string(res.Stdout)
	for _, want := range []string{"PPid:\t1\n", "spawn\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("the command's view: got %q, want %q in it (stderr %q)", out, want, res.Stderr)
		}
	}
	if !strings.Contains(out, "job:/") || strings.Contains(out, "job:/\n") {
		t.Errorf("the command's cgroup: got %q, want an exec cgroup of the job hierarchy", out)
	}
	// python3 as the exec's process: nothing blocked, and no signal ignored or handled but
	// SIGINT, SIGPIPE and SIGXFSZ, which python sets itself.
	check := "import signal as s; print(s.pthread_sigmask(s.SIG_BLOCK, []) == set(), all(s.getsignal(g) == s.SIG_DFL " +
		"for g in s.valid_signals() if g not in (s.SIGKILL, s.SIGSTOP, s.SIGINT, s.SIGPIPE, s.SIGXFSZ)))"
	if res := runtimetest.MustRun(t, c, proto.ExecRequest{Argv: []string{"python3", "-c", check}}); string(res.Stdout) != "True True\n" {
		t.Errorf("a command's signal mask and dispositions: got %q (stderr %q), want none blocked, all at their default", res.Stdout, res.Stderr)
	}
	if got := health().SpawnerStarts; got != h.SpawnerStarts+2 {
		t.Errorf("spawner starts: got %d, want %d", got, h.SpawnerStarts+2)
	}

	// Its socket, environment and memory are out of a command's reach, and so is ptrace.
	reach := `
import ctypes, os
for p in ("fd/3", "environ", "mem"):
    try:
        os.close(os.open("/proc/` + sp + `/" + p, os.O_RDONLY)); print("opened", p)
    except PermissionError:
        print("refused", p)
libc = ctypes.CDLL(None, use_errno=True)
print("ptrace", libc.ptrace(16, ` + sp + `, 0, 0), ctypes.get_errno())
`
	res = runtimetest.MustRun(t, c, proto.ExecRequest{Argv: []string{"python3", "-c", reach}})
	if want := "refused fd/3\nrefused environ\nrefused mem\nptrace -1 1\n"; string(res.Stdout) != want {
		t.Errorf("reaching into the program: got %q (stderr %q), want %q", res.Stdout, res.Stderr, want)
	}

	// Every signal but SIGKILL and SIGSTOP, three times.
	script := "for s in $(seq 1 64); do case $s in 9|19) continue;; esac; kill -$s " + sp + "; kill -$s " + sp + "; kill -$s " + sp + "; done; echo sent"
	if res := runtimetest.MustRun(t, c, proto.ExecRequest{Argv: []string{"sh", "-c", script}}); string(res.Stdout) != "sent\n" {
		t.Fatalf("signalling the program: stdout %q, stderr %q", res.Stdout, res.Stderr)
	}
	time.Sleep(100 * time.Millisecond)
	if res := runtimetest.MustRun(t, c, proto.ExecRequest{Argv: []string{"echo", "still"}}); string(res.Stdout) != "still\n" {
		t.Fatalf("after the signals: %q", res.Stdout)
	}
	if got := health(); got.SpawnerPid != h.SpawnerPid {
		t.Fatalf("after the signals: spawner pid %d, want %d", got.SpawnerPid, h.SpawnerPid)
	}

	// Killed (`kill -9 -1` kills it too), PID 1 forks the commands itself, and replaces the
	// program a second later.
	checkCmd := func(when string) {
		t.Helper()
		res := runtimetest.MustRun(t, c, proto.ExecRequest{Argv: []string{"sh", "-c", "grep PPid /proc/$$/status; grep job /proc/$$/cgroup"}})
		if out := string(res.Stdout); !strings.Contains(out, "PPid:\t1\n") || !strings.Contains(out, "job:/") || strings.Contains(out, "job:/\n") {
			t.Fatalf("a command %s: %q (stderr %q)", when, out, res.Stderr)
		}
	}
	runtimetest.MustRun(t, c, proto.ExecRequest{Argv: []string{"sh", "-c", "kill -9 -1; true"}})
	deadline = time.Now().Add(10 * time.Second)
	for health().SpawnerPid == h.SpawnerPid {
		if time.Now().After(deadline) {
			t.Fatal("PID 1 still reports the killed spawner program")
		}
		time.Sleep(20 * time.Millisecond)
	}
	checkCmd("right after the program died")
	var replaced proto.Health
	for deadline = time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if replaced = health(); replaced.SpawnerPid != 0 && replaced.SpawnerPid != h.SpawnerPid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the killed spawner program was not replaced")
		}
	}
	checkCmd("through the new program")
	if got := health(); got.SpawnerPid != replaced.SpawnerPid || got.SpawnerStarts != replaced.SpawnerStarts+1 {
		t.Fatalf("the new program: got %+v, want pid %d and one more start than %d", got, replaced.SpawnerPid, replaced.SpawnerStarts)
	}
	if b, err := d.Get(ctxT(t), id); err != nil || b.Phase != runtime.PhaseRunning {
		t.Fatalf("the box: phase %v (%s), %v", b.Phase, b.Reason, err)
	}
}

func TestMemoryLimitVisible(t *testing.T) {
	d := newDriver(t)
	spec := defaultSpec()
	spec.MemoryBytes = 256 << 20
	id := runtimetest.CreateBox(t, d, spec)
	res := runtimetest.MustRun(t, runtimetest.Client(t, d, id), proto.ExecRequest{Argv: []string{"grep", "MemTotal", "/proc/meminfo"}})
	f := strings.Fields(string(res.Stdout))
	if len(f) < 2 || f[1] != strconv.Itoa(256<<10) {
		t.Errorf("got %q, want MemTotal %d kB", res.Stdout, 256<<10)
	}
}

func TestFilesystems(t *testing.T) {
	d := newDriver(t)
	// Whether the shared rootfs had these before: other users of it may make them.
	hadBefore := map[string]bool{}
	for _, p := range []string{".sbx/init", ".sbx/x", "etc/x"} {
		_, err := os.Stat(filepath.Join(components.rootfs, p))
		hadBefore[p] = err == nil
	}
	id := runtimetest.CreateBox(t, d, defaultSpec())
	c := runtimetest.Client(t, d, id)
	for _, tc := range []struct {
		name  string
		cmd   string
		works bool
	}{
		{"RootfsReadOnly", "echo x > /etc/x", false},
		{"InitReadOnly", "echo x > /.sbx/init", false},
		{"InitFolderReadOnly", "touch /.sbx/x", false},
		{"WorkspaceWritable", "echo x > /workspace/x && cat /workspace/x", true},
		{"TmpWritable", "echo x > /tmp/x && cat /tmp/x", true},
		{"ShmWritable", "echo x > /dev/shm/x", true},
		{"CwdIsWorkspace", `test "$(pwd)" = /workspace`, true},
		{"EnvFromSpec", `test "$SANDBOX_TEST_ENV" = 1 && test -n "$PATH"`, true},
		{"InitIsPid1", `test "$(cat /proc/1/cmdline | tr '\0' ' ')" = "/.sbx/init "`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := runtimetest.MustRun(t, c, proto.ExecRequest{Argv: []string{"sh", "-c", tc.cmd}})
			if got := res.Exit.ExitCode == 0; got != tc.works {
				t.Errorf("%s: got exit %d (stderr %q), want success %v", tc.cmd, res.Exit.ExitCode, res.Stderr, tc.works)
			}
		})
	}
	// Neither the box's writes nor runsc's mount points reach the shared rootfs.
	for p, had := range hadBefore {
		if _, err := os.Stat(filepath.Join(components.rootfs, p)); err == nil && !had {
			t.Errorf("the shared rootfs gained %s during the test", p)
		}
	}
}

// A command keeps running when the attach that started it is closed, and the box stays up.
func TestBoxSurvivesAttachClose(t *testing.T) {
	d := newDriver(t)
	id := runtimetest.CreateBox(t, d, defaultSpec())
	rwc, err := d.Attach(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.DialContext(ctxT(t), rwc)
	if err != nil {
		t.Fatal(err)
	}
	execID := runtimetest.NewExecID()
	if _, err := c.StartExec(ctxT(t), proto.ExecRequest{ID: execID, Argv: []string{"sh", "-c", "sleep 1; echo done > marker; echo finished"}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Logf("Close: %v", err)
	}
	// Past 2 s Close would have had to kill the attach: the guest's connect did not end on
	// its own.
	if el := time.Since(start); el > 1900*time.Millisecond {
		t.Errorf("closing an attach took %v, want it to end without being killed", el)
	}
	if b, _ := d.Get(ctxT(t), id); b.Phase != runtime.PhaseRunning {
		t.Fatalf("got phase %s (%s) after closing the attach, want running", b.Phase, b.Reason)
	}
	c2 := runtimetest.Client(t, d, id)
	lr, err := c2.Log(ctxT(t), execID, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer lr.Close()
	var out string
	for {
		rec, err := lr.Next()
		if err != nil {
			t.Fatalf("log: %v", err)
		}
		if rec.Kind == proto.RecordStdout {
			out += string(rec.Data)
		}
		if rec.Kind == proto.RecordExit {
			break
		}
	}
	if out != "finished\n" {
		t.Errorf("got output %q, want %q", out, "finished\n")
	}
	res := runtimetest.MustRun(t, c2, proto.ExecRequest{Argv: []string{"cat", "marker"}})
	if string(res.Stdout) != "done\n" {
		t.Errorf("got marker %q, want %q", res.Stdout, "done\n")
	}
}

// Attaches go through the box's host socket: no connect process in the box, no runsc exec
// on the host. Without the socket they fall back to `runsc exec … connect`, and closed
// fallback attaches leave nothing behind either.
func TestAttachCloseLeavesNothing(t *testing.T) {
	d := newDriver(t)
	id := runtimetest.CreateBox(t, d, defaultSpec())
	attachAndClose := func() {
		for i := 0; i < 5; i++ {
			rwc, err := d.Attach(ctxT(t), id)
			if err != nil {
				t.Fatal(err)
			}
			if i%2 == 0 {
				c, err := client.DialContext(ctxT(t), rwc)
				if err != nil {
					t.Fatal(err)
				}
				c.Close()
			} else {
				rwc.Close() // closed before any byte went through
			}
		}
	}
	count := func(wantConnect, wantExec int) {
		t.Helper()
		res := runtimetest.MustRun(t, runtimetest.Client(t, d, id), proto.ExecRequest{Argv: []string{"sh", "-c", "ps -eo args= | grep -c '^/.sbx/init connect'"}})
		if got := strings.TrimSpace(string(res.Stdout)); got != fmt.Sprint(wantConnect) {
			t.Errorf("got %s connect processes in the box, want %d", got, wantConnect)
		}
		execs := 0
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			b, _ := os.ReadFile(p)
			if strings.Contains(string(b), "\x00exec\x00") && strings.Contains(string(b), id) {
				execs++
			}
		}
		if execs != wantExec {
			t.Errorf("got %d runsc exec processes of the box on the host, want %d", execs, wantExec)
		}
	}
	attachAndClose()
	count(0, 0) // the counting attach itself dials the host socket
	sock := filepath.Join(stateDirOf(t, d), "boxes", id, "host", "init.sock")
	if err := os.Remove(sock); err != nil {
		t.Fatalf("the box has no host socket: %v", err)
	}
	attachAndClose()
	count(1, 1) // the counting attach is a fallback one
}

func TestStartFreshWorkspace(t *testing.T) {
	d := newDriver(t)
	id := runtimetest.CreateBox(t, d, defaultSpec())
	if err := d.Stop(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	// The box's disk (its workspace) is gone: the box starts on a new, empty one.
	box := filepath.Join(stateDirOf(t, d), "boxes", id)
	if err := os.Remove(filepath.Join(box, "disk.img")); err != nil {
		t.Fatal(err)
	}
	fresh, err := d.Start(ctxT(t), id)
	if err != nil || !fresh {
		t.Fatalf("Start without a workspace: got (%v, %v), want (true, nil)", fresh, err)
	}
	runtimetest.MustRun(t, runtimetest.Client(t, d, id), proto.ExecRequest{Argv: []string{"touch", "y"}})
	ws := filepath.Join(box, "disk", "workspace")
	if _, err := os.Stat(filepath.Join(ws, "y")); err != nil {
		t.Errorf("the new workspace is not the mounted one: %v", err)
	}

	// The disk is there but its workspace folder is not: fresh as well.
	if err := os.RemoveAll(ws); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	if fresh, err := d.Start(ctxT(t), id); err != nil || !fresh {
		t.Fatalf("Start without a workspace folder on the disk: got (%v, %v), want (true, nil)", fresh, err)
	}
}

func stateDirOf(t *testing.T, d *gvisor.Driver) string {
	t.Helper()
	return filepath.Dir(d.RootDir())
}

func TestCleanupLeavesNothing(t *testing.T) {
	d := newDriver(t)
	a := runtimetest.CreateBox(t, d, defaultSpec())
	b := runtimetest.CreateBox(t, d, defaultSpec())
	if err := d.Stop(ctxT(t), a); err != nil {
		t.Fatal(err)
	}
	if m := mountsUnder(t, stateDirOf(t, d)); len(m) == 0 {
		t.Logf("no mount while a box runs (runsc did not mount null-netns)")
	}
	for _, id := range []string{a, b} {
		if err := d.Delete(ctxT(t), id); err != nil {
			t.Fatal(err)
		}
		for _, cg := range []string{"memory", "cpu", "pids"} {
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", cg, id)); err == nil {
				t.Errorf("cgroup %s/%s left behind", cg, id)
			}
		}
	}
	if m := mountsUnder(t, stateDirOf(t, d)); len(m) > 0 {
		t.Errorf("mounts left: %q", m)
	}
	entries, _ := os.ReadDir(filepath.Join(stateDirOf(t, d), "boxes"))
	if len(entries) != 0 {
		t.Errorf("box folders left: %v", entries)
	}
}

func TestCreateFailureCleansUp(t *testing.T) {
	d := newDriver(t)
	spec := defaultSpec()
	// A rootfs whose /.sbx is a file: the guest init cannot be mounted, so the container
	// cannot come up after runsc has made its state.
	spec.Rootfs = t.TempDir()
	if err := os.WriteFile(filepath.Join(spec.Rootfs, ".sbx"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rec := runtimetest.NewRecord(spec)
	err := d.Create(ctxT(t), rec)
	if err == nil {
		d.Delete(ctxT(t), rec.ID)
		t.Fatal("Create on an empty rootfs succeeded")
	}
	t.Logf("Create: %v", err)
	if _, err := d.Get(ctxT(t), rec.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Get after a failed Create: got %v, want ErrNotFound", err)
	}
	// newDriver's cleanup checks that no container or mount is left.
}

func TestInvalidInput(t *testing.T) {
	d := newDriver(t)
	for _, id := range []string{"", "../x", "-x", "a/b", "a b", strings.Repeat("a", gvisor.MaxIDLen+1), "--root=/"} {
		rec := runtimetest.NewRecord(defaultSpec())
		rec.ID = id
		if err := d.Create(ctxT(t), rec); err == nil {
			t.Errorf("Create(%q) succeeded, want an error", id)
		}
		if _, err := d.Get(ctxT(t), id); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("Get(%q): got %v, want ErrNotFound", id, err)
		}
	}
	// Ids that are prefixes of one another would make runsc's prefix matching reach the wrong box.
	id := runtimetest.CreateBox(t, d, defaultSpec())
	for _, other := range []string{id[:len(id)-1], id + "X"} {
		rec := runtimetest.NewRecord(defaultSpec())
		rec.ID = other
		if err := d.Create(ctxT(t), rec); err == nil {
			d.Delete(ctxT(t), other)
			t.Errorf("Create(%q) beside %q succeeded, want an error", other, id)
		}
	}
	for name, mutate := range map[string]func(*runtime.BoxSpec){
		"RelativeRootfs": func(s *runtime.BoxSpec) { s.Rootfs = "rootfs" },
		"HostRoot":       func(s *runtime.BoxSpec) { s.Rootfs = "/" },
		"Network":        func(s *runtime.BoxSpec) { s.Network = "host" },
		"EnvKey":         func(s *runtime.BoxSpec) { s.Env = map[string]string{"A=B": "c"} },
		"TinyMemory":     func(s *runtime.BoxSpec) { s.MemoryBytes = 1 << 20 },
		"ReservedEnv":    func(s *runtime.BoxSpec) { s.Env = map[string]string{"SBX_SOCKET": "/tmp/x"} },
	} {
		spec := defaultSpec()
		mutate(&spec)
		if err := d.Create(ctxT(t), runtimetest.NewRecord(spec)); err == nil {
			t.Errorf("%s: Create succeeded, want an error", name)
		}
	}
}

// Two drivers over one StateDir (two processes, in effect) do not lose record updates.
func TestUpdateRecordAcrossDrivers(t *testing.T) {
	d1 := newDriver(t)
	d2, err := gvisor.New(gvisor.Options{Runsc: components.runsc, StateDir: stateDirOf(t, d1), InitBinary: components.init})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d2.Close() })
	id := runtimetest.CreateBox(t, d1, defaultSpec())
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		d := []*gvisor.Driver{d1, d2}[i%2]
		wg.Go(func() {
			if _, err := d.UpdateRecord(ctxT(t), id, func(r *runtime.Record) error { r.TTLSec++; return nil }); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	b, err := d2.Get(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if want := runtimetest.NewRecord(defaultSpec()).TTLSec + 20; b.Record.TTLSec != want {
		t.Errorf("got ttl %d, want %d", b.Record.TTLSec, want)
	}
}

func TestCheck(t *testing.T) {
	d := newDriver(t)
	if err := d.Check(ctxT(t)); err != nil {
		t.Errorf("Check: %v", err)
	}
	bad, err := gvisor.New(gvisor.Options{Runsc: components.runsc, StateDir: t.TempDir(), InitBinary: "/nonexistent/init"})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if err := bad.Check(ctxT(t)); err == nil {
		t.Errorf("Check with a missing init: got nil, want an error")
	}
}

// Check runs `runsc --version` once per runsc binary: again only when the binary at the path
// changed (here: replaced by a rename, as an upgrade does), so a broken upgrade turns the
// replica unready while an unchanged binary costs the probe a stat.
func TestCheckRunscOncePerBinary(t *testing.T) {
	dir := t.TempDir()
	runsc := filepath.Join(dir, "runsc")
	count := filepath.Join(dir, "count")
	put := func(body string) {
		t.Helper()
		tmp := runsc + ".new"
		if err := os.WriteFile(tmp, []byte("#!/bin/sh\necho run >> "+count+"\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, runsc); err != nil {
			t.Fatal(err)
		}
	}
	runs := func() int {
		b, _ := os.ReadFile(count)
		return strings.Count(string(b), "run")
	}
	put("echo 'runsc version test'")
	d, err := gvisor.New(gvisor.Options{Runsc: runsc, StateDir: t.TempDir(), InitBinary: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for range 3 {
		if err := d.Check(ctxT(t)); err != nil {
			t.Fatalf("Check: %v", err)
		}
	}
	if got := runs(); got != 1 {
		t.Errorf("runsc ran %d times for 3 checks of one binary, want 1", got)
	}
	put("echo broken >&2; exit 3")
	if err := d.Check(ctxT(t)); err == nil || !strings.Contains(err.Error(), "broken") {
		t.Errorf("Check after a broken runsc replaced the good one: got %v, want its failure", err)
	}
	if err := d.Check(ctxT(t)); err == nil {
		t.Errorf("a second Check of the broken runsc: got nil, want its failure again")
	}
	put("echo 'runsc version test 2'")
	if err := d.Check(ctxT(t)); err != nil {
		t.Errorf("Check after the fix: %v", err)
	}
	if got := runs(); got != 4 {
		t.Errorf("runsc ran %d times, want 4 (one per check of a new or failing binary)", got)
	}
}

// A guest init that exits at once: Create notices the dead sandbox, fails without waiting for
// the whole ready timeout, and leaves nothing behind.
func TestCreateGuestNeverReady(t *testing.T) {
	need(t)
	dir, err := os.MkdirTemp("", "sbxg")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	initScript := filepath.Join(t.TempDir(), "init")
	if err := os.WriteFile(initScript, []byte("#!/bin/sh\necho 'init: giving up' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := gvisor.New(gvisor.Options{Runsc: components.runsc, StateDir: dir, InitBinary: initScript, ReadyTimeout: 8 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	rec := runtimetest.NewRecord(defaultSpec())
	start := time.Now()
	err = d.Create(ctxT(t), rec)
	if err == nil {
		d.Delete(ctxT(t), rec.ID)
		t.Fatal("Create with a failing init succeeded")
	}
	t.Logf("Create failed after %v: %v", time.Since(start), err)
	if el := time.Since(start); el > 6*time.Second {
		t.Errorf("Create took %v to notice the dead sandbox, want less than the ready timeout", el)
	}
	if _, err := d.Get(ctxT(t), rec.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Get after a failed Create: got %v, want ErrNotFound", err)
	}
	if out, _ := exec.Command(components.runsc, "--root="+d.RootDir(), "list", "-quiet").Output(); strings.TrimSpace(string(out)) != "" {
		t.Errorf("containers left: %q", out)
	}
	if m := mountsUnder(t, dir); len(m) > 0 {
		t.Errorf("mounts left: %q", m)
	}
}
