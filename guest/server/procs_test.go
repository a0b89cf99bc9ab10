package server_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/guesttest"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
)

// The tests of this file drive the tracking without cgroups (a server on the host): process
// group and parentage. The cgroup tracking only exists inside gVisor; the conformance suite
// (runtime/runtimetest) and tests/procs_test.go try the same attacks there.

// markers returns n sleep durations no other process on the machine uses: they mark a test's
// processes whatever they do to their environment (env -i drops SBX_EXEC_ID).
func markers(t *testing.T, n int) []string {
	t.Helper()
	base := rand.IntN(900000) + 100000
	var m []string
	for i := range n {
		m = append(m, fmt.Sprintf("%d.%06d", 900+i, base))
	}
	// Whatever a failed test leaves behind is ended here, by pid.
	t.Cleanup(func() {
		for _, pid := range marked(m...) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return m
}

// marked lists the live processes whose command line carries one of the markers as an
// argument (what `ps -eo args` shows, so an `exec -a` rename does not hide them).
func marked(markers ...string) []int {
	return guesttest.LiveProcs("cmdline", func(arg []byte) bool { return slices.Contains(markers, string(arg)) })
}

func waitMarked(t *testing.T, want int, markers ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := marked(markers...)
		if len(got) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes carrying %q: got %d (%v), want %d", markers, len(got), got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestHealthProcessTracking(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverNetPipe)
	got, err := h.C.Health(guesttest.Ctx(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got.ProcessTracking != proto.TrackingProcessGroup {
		t.Errorf("process_tracking: got %q, want %q (no cgroups on a host)", got.ProcessTracking, proto.TrackingProcessGroup)
	}
}

func TestOpenCgroupsOnlyInPID1(t *testing.T) {
	if os.Getpid() == 1 {
		t.Skip("the test runs as PID 1")
	}
	if c, err := server.OpenCgroups(); err == nil {
		c.Close()
		t.Fatal("OpenCgroups outside PID 1: got no error, want a refusal (it must never mount on a host)")
	}
}

// TestTimeoutKillsEscapedTree: processes that leave the exec's session and group and drop its
// environment still end with the timeout, as long as their parent is one of the exec's.
func TestTimeoutKillsEscapedTree(t *testing.T) {
	modes(t, func(t *testing.T, opts server.Options) {
		h := guesttest.New(t, opts, guesttest.OverSocketpair)
		m := markers(t, 5)
		script := fmt.Sprintf(`setsid env -i sleep %s &
setsid sh -c 'env -i sleep %s & wait' &
nohup bash -c 'exec -a x sleep %s' >/dev/null 2>&1 &
set -m; env -i sleep %s &
sleep %s`, m[0], m[1], m[2], m[3], m[4])
		done := make(chan struct{})
		var res client.RunResult
		var err error
		go func() {
			defer close(done)
			res, err = h.C.Run(guesttest.Ctx(t, 30*time.Second), proto.ExecRequest{ID: "escape", Argv: []string{"sh", "-c", script}, TimeoutMs: 2000}, 0, 0)
		}()
		waitMarked(t, 5, m...) // all of them ran
		<-done
		if err != nil {
			t.Fatal(err)
		}
		if !res.Exit.TimedOut {
			t.Errorf("exit: got %+v, want timed out", res.Exit)
		}
		waitMarked(t, 0, m...)
	})
}

// TestSignalAfterNormalExit: what an exec leaves running in the background survives its
// normal exit, and a signal sent to the ended exec still reaches all of it, a child that
// left the group included.
func TestSignalAfterNormalExit(t *testing.T) {
	modes(t, func(t *testing.T, opts server.Options) {
		h := guesttest.New(t, opts, guesttest.OverSocketpair)
		ctx := guesttest.Ctx(t, 30*time.Second)
		m := markers(t, 2)
		script := fmt.Sprintf(`sleep %s & sh -c 'setsid env -i sleep %s & wait' >/dev/null 2>&1 & echo started`, m[0], m[1])
		res, err := h.C.Run(ctx, proto.ExecRequest{ID: "bg-left", Argv: []string{"sh", "-c", script}}, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if res.Exit.ExitCode != 0 || res.Exit.TimedOut {
			t.Fatalf("exit: got %+v, want 0", res.Exit)
		}
		waitMarked(t, 2, m...)
		time.Sleep(300 * time.Millisecond)
		waitMarked(t, 2, m...) // still running after the exit
		if err := h.C.Signal(ctx, "bg-left", "SIGTERM"); err != nil {
			t.Fatal(err)
		}
		waitMarked(t, 0, m...)
	})
}

// TestCloseKillsEscapedTree: Close ends a running exec's escaped processes too.
func TestCloseKillsEscapedTree(t *testing.T) {
	modes(t, func(t *testing.T, opts server.Options) {
		h := guesttest.New(t, opts, guesttest.OverSocketpair)
		m := markers(t, 2)
		script := fmt.Sprintf(`setsid env -i sleep %s & sleep %s`, m[0], m[1])
		if _, err := h.C.StartExec(guesttest.Ctx(t, 10*time.Second), proto.ExecRequest{ID: "close", Argv: []string{"sh", "-c", script}}); err != nil {
			t.Fatal(err)
		}
		waitMarked(t, 2, m...)
		h.Srv.Close()
		waitMarked(t, 0, m...)
	})
}
