package server_test

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/guest/client"
	"sandboxd/guest/guesttest"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
)

func spawnerHarness(t *testing.T) *guesttest.Harness {
	t.Helper()
	return guesttest.New(t, server.Options{Reap: true, Spawner: guesttest.Spawner(t)}, guesttest.OverSocketpair)
}

func health(t *testing.T, c *client.Client) proto.Health {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := c.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

var runs atomic.Int64

func run(t *testing.T, c *client.Client, argv ...string) client.RunResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := "spawner-" + strconv.FormatInt(runs.Add(1), 10)
	res, err := c.Run(ctx, proto.ExecRequest{ID: id, Argv: argv}, 1<<20, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// statusField is a field of /proc/<pid>/status as text.
func statusField(status, name string) string {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestSpawnerStartsCommands: with a spawner program, the commands are started by it, as the
// server's own children (CLONE_PARENT: the reaper waits for them), with no signal blocked or
// ignored, and each start is counted.
func TestSpawnerStartsCommands(t *testing.T) {
	h := spawnerHarness(t)
	before := health(t, h.C)
	if before.SpawnerPid <= 0 {
		t.Fatalf("health: got %+v, want the spawner program's pid", before)
	}
	res := run(t, h.C, "cat", "/proc/self/status")
	if res.Exit.ExitCode != 0 {
		t.Fatalf("cat: %+v %s", res.Exit, res.Stderr)
	}
	st := string(res.Stdout)
	if got := statusField(st, "PPid"); got != strconv.Itoa(os.Getpid()) {
		t.Errorf("the command's parent: got %s, want the server's process %d", got, os.Getpid())
	}
	for _, f := range []string{"SigBlk", "SigIgn"} {
		if got := statusField(st, f); strings.Trim(got, "0") != "" {
			t.Errorf("the command's %s: got %s, want none", f, got)
		}
	}
	after := health(t, h.C)
	if after.SpawnerStarts != before.SpawnerStarts+1 || after.SpawnerPid != before.SpawnerPid {
		t.Fatalf("health: got %+v after one exec, before %+v", after, before)
	}
}

// TestSpawnerOutlivesStraySignals: every signal a command could send the spawner program but
// SIGKILL and SIGSTOP (1 to 64, the C library's own 32 and 33 among them) leaves it serving.
func TestSpawnerOutlivesStraySignals(t *testing.T) {
	h := spawnerHarness(t)
	pid := health(t, h.C).SpawnerPid
	for sig := syscall.Signal(1); sig <= 64; sig++ {
		if sig == syscall.SIGKILL || sig == syscall.SIGSTOP {
			continue
		}
		if err := syscall.Kill(pid, sig); err != nil {
			t.Fatalf("kill %v: %v", sig, err)
		}
	}
	if res := run(t, h.C, "echo", "still"); string(res.Stdout) != "still\n" {
		t.Fatalf("echo: %+v", res)
	}
	if got := health(t, h.C); got.SpawnerPid != pid || got.SpawnerStarts != 1 {
		t.Fatalf("health: got %+v, want pid %d and one start", got, pid)
	}
}

// TestSpawnerKilledFallsBack: when the program dies, the server starts the commands itself,
// and replaces the program after a delay that doubles with every death.
func TestSpawnerKilledFallsBack(t *testing.T) {
	defer server.SetSpawnerRestartDelay(300 * time.Millisecond)()
	h := spawnerHarness(t)
	first := health(t, h.C).SpawnerPid
	killed := time.Now() // the delay runs from the death, which comes after this
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for health(t, h.C).SpawnerPid == first {
		if time.Now().After(deadline) {
			t.Fatal("the server still reports the killed spawner program")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if res := run(t, h.C, "echo", "meanwhile"); string(res.Stdout) != "meanwhile\n" {
		t.Fatalf("echo after the program died: %+v", res)
	}
	// Replaced: a new program, which starts the next command.
	replaced := func(old int, after time.Duration) int {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if pid := health(t, h.C).SpawnerPid; pid != 0 && pid != old {
				if waited := time.Since(killed); waited < after {
					t.Fatalf("replaced after %v, want no sooner than %v", waited, after)
				}
				return pid
			}
			if time.Now().After(deadline) {
				t.Fatal("the killed spawner program was not replaced")
			}
		}
	}
	second := replaced(first, 300*time.Millisecond)
	starts := health(t, h.C).SpawnerStarts
	if res := run(t, h.C, "echo", "again"); string(res.Stdout) != "again\n" {
		t.Fatalf("echo through the new program: %+v", res)
	}
	if got := health(t, h.C).SpawnerStarts; got != starts+1 {
		t.Fatalf("starts of the new program: got %d, want %d", got, starts+1)
	}
	// A second death waits twice as long.
	killed = time.Now()
	if err := syscall.Kill(second, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	replaced(second, 600*time.Millisecond)
}

// TestSpawnerStoppedFailsOneStart: a stopped program (SIGSTOP, which nothing can block) makes
// the start in flight fail after the timeout, with a message that says the command may have
// started (the server does not start it twice); the program is killed and the next commands
// start without it.
func TestSpawnerStoppedFailsOneStart(t *testing.T) {
	defer server.SetSpawnTimeout(300 * time.Millisecond)()
	h := spawnerHarness(t)
	pid := health(t, h.C).SpawnerPid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	res := run(t, h.C, "echo", "lost")
	if res.Exit.ExitCode != 126 || !strings.Contains(res.Exit.Error, "may have started") || len(res.Stdout) != 0 {
		t.Fatalf("the start through a stopped program: got %+v stdout %q, want 126 saying it may have started", res.Exit, res.Stdout)
	}
	if res := run(t, h.C, "echo", "next"); string(res.Stdout) != "next\n" {
		t.Fatalf("the next start: %+v", res)
	}
	if got := health(t, h.C).SpawnerPid; got == pid {
		t.Fatalf("the stopped program still serves: pid %d", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		// A zombie until the reaper takes it; gone after.
		if time.Now().After(deadline) {
			t.Fatalf("the stopped program %d was not killed", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// spawnerRaw starts the spawner program on its own with one end of a SOCK_SEQPACKET pair and
// returns the other end; the program is killed and waited for when the test ends.
func spawnerRaw(t *testing.T) int {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	theirs := os.NewFile(uintptr(fds[1]), "spawner")
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	p, err := os.StartProcess(guesttest.Spawner(t), []string{"sandbox-spawn"}, &os.ProcAttr{
		Files: []*os.File{devNull, devNull, devNull, theirs}})
	theirs.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.Close(fds[0]) // the program exits at EOF
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = p.Wait()
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = p.Kill()
			<-done
			t.Error("the spawner program did not exit when its socket closed")
		}
	})
	tv := unix.NsecToTimeval((10 * time.Second).Nanoseconds())
	if err := unix.SetsockoptTimeval(fds[0], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	return fds[0]
}

// rawRequest is a request as spawner.go encodes it, with any header values.
func rawRequest(magic, flags, argc, envc uint32, strs ...string) []byte {
	b := binary.LittleEndian.AppendUint32(nil, magic)
	b = binary.LittleEndian.AppendUint32(b, flags)
	b = binary.LittleEndian.AppendUint32(b, argc)
	b = binary.LittleEndian.AppendUint32(b, envc)
	for _, s := range strs {
		b = append(append(b, s...), 0)
	}
	return b
}

// ask sends one request with the given descriptors and returns the answer's pid and errno.
func ask(t *testing.T, sock int, req []byte, fds ...int) (int32, syscall.Errno) {
	t.Helper()
	pid, errno, _ := askStep(t, sock, req, fds...)
	return pid, errno
}

// askStep is ask that also returns the step that failed.
func askStep(t *testing.T, sock int, req []byte, fds ...int) (int32, syscall.Errno, uint32) {
	t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := unix.Sendmsg(sock, req, oob, nil, unix.MSG_NOSIGNAL); err != nil {
		t.Fatalf("send: %v", err)
	}
	var a [16]byte
	n, err := unix.Read(sock, a[:])
	for errors.Is(err, unix.EINTR) { // a SIGCHLD: a read with a timeout is not restarted
		n, err = unix.Read(sock, a[:])
	}
	if err != nil || n != 12 {
		t.Fatalf("answer: %d bytes, %v", n, err)
	}
	return int32(binary.LittleEndian.Uint32(a[:])), syscall.Errno(binary.LittleEndian.Uint32(a[4:])), binary.LittleEndian.Uint32(a[8:])
}

// TestSpawnerRefusesMalformedRequests: the program checks every request to the byte and
// answers EINVAL for each bad one, starting nothing, and serves the next good one.
func TestSpawnerRefusesMalformedRequests(t *testing.T) {
	sock := spawnerRaw(t)
	null, err := unix.Open(os.DevNull, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(null)
	const magic = 0x53425831
	good := func() []byte { return rawRequest(magic, 1, 1, 1, "/bin/true", "/", "true", "A=b") }
	tests := []struct {
		name string
		req  []byte
		fds  []int
	}{
		{"empty", nil, []int{null, null, null}},
		{"short header", good()[:10], []int{null, null, null}},
		{"bad magic", rawRequest(magic+1, 1, 1, 0, "/bin/true", "/", "true"), []int{null, null, null}},
		{"unknown flag", rawRequest(magic, 8, 1, 0, "/bin/true", "/", "true"), []int{null, null, null}},
		{"no arguments", rawRequest(magic, 1, 0, 0, "/bin/true", "/"), []int{null, null, null}},
		{"too many strings", rawRequest(magic, 1, 20000, 0, "/bin/true", "/", "true"), []int{null, null, null}},
		{"counts overflow", rawRequest(magic, 1, 0xffffffff, 2, "/bin/true", "/", "true"), []int{null, null, null}},
		{"more strings than the counts", rawRequest(magic, 1, 1, 0, "/bin/true", "/", "true", "extra"), []int{null, null, null}},
		{"fewer strings than the counts", rawRequest(magic, 1, 2, 1, "/bin/true", "/", "true"), []int{null, null, null}},
		{"last string without its NUL", good()[:len(good())-1], []int{null, null, null}},
		{"empty path", rawRequest(magic, 1, 1, 0, "", "/", "true"), []int{null, null, null}},
		{"empty folder", rawRequest(magic, 1, 1, 0, "/bin/true", "", "true"), []int{null, null, null}},
		{"no descriptors", good(), nil},
		{"two descriptors", good(), []int{null, null}},
		{"four descriptors without the cgroup flag", good(), []int{null, null, null, null}},
		{"three descriptors with the cgroup flag", rawRequest(magic, 5, 1, 0, "/bin/true", "/", "true"), []int{null, null, null}},
		{"five descriptors", good(), []int{null, null, null, null, null}},
		{"larger than the program reads", append(good(), make([]byte, 150<<10)...), []int{null, null, null}},
	}
	for _, tt := range tests {
		pid, errno := ask(t, sock, tt.req, tt.fds...)
		if pid != 0 || errno != syscall.EINVAL {
			t.Errorf("%s: got pid %d, errno %v; want EINVAL", tt.name, pid, errno)
		}
	}
	// Still serving: a good request starts a process, our child (CLONE_PARENT), which exits 0.
	pid, errno := ask(t, sock, good(), null, null, null)
	if pid <= 0 || errno != 0 {
		t.Fatalf("a good request: got pid %d, errno %v", pid, errno)
	}
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(int(pid), &ws, 0, nil); err != nil || !ws.Exited() || ws.ExitStatus() != 0 {
		t.Fatalf("waiting for the started process: %v, status %v", err, ws)
	}
	// A command that cannot run: its errno, and the child, which exited with 127, is ours to
	// reap.
	readOnly, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(readOnly)
	for _, tt := range []struct {
		req   []byte
		fds   []int
		errno syscall.Errno
		step  uint32
	}{
		{rawRequest(magic, 1, 1, 0, "/no/such/program", "/", "x"), []int{null, null, null}, syscall.ENOENT, 7},
		{rawRequest(magic, 1, 1, 0, "/bin/true", "/no/such/folder", "true"), []int{null, null, null}, syscall.ENOENT, 3},
		// A "cgroup" file the child cannot write to.
		{rawRequest(magic, 5, 1, 0, "/bin/true", "/", "true"), []int{null, null, null, readOnly}, syscall.EBADF, 1},
	} {
		pid, errno, step := askStep(t, sock, tt.req, tt.fds...)
		if pid <= 0 || errno != tt.errno || step != tt.step {
			t.Fatalf("a start that fails: got pid %d, errno %v, step %d; want the child, %v, step %d", pid, errno, step, tt.errno, tt.step)
		}
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(int(pid), &ws, 0, nil); err != nil || ws.ExitStatus() != 127 {
			t.Fatalf("reaping a child that could not run: %v, status %v", err, ws)
		}
	}
}

// TestSpawnerMissing: a box without the program (an image of one's own on Kubernetes) starts
// its commands through Go's fork, and Warm says nothing is wrong.
func TestSpawnerMissing(t *testing.T) {
	h := guesttest.New(t, server.Options{Reap: true, Spawner: "/no/such/sandbox-spawn"}, guesttest.OverSocketpair)
	if got := health(t, h.C); got.SpawnerPid != 0 {
		t.Fatalf("health: got %+v, want no spawner program", got)
	}
	if res := run(t, h.C, "echo", "fine"); string(res.Stdout) != "fine\n" {
		t.Fatalf("echo: %+v", res)
	}
}
