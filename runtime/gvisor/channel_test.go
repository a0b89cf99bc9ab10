package gvisor_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sandboxd/guest/proto"
	"sandboxd/guest/server"
	"sandboxd/runtime"
	"sandboxd/runtime/gvisor"
	"sandboxd/runtime/runtimetest"
)

// The box's own defences (the host folder hidden, the abstract socket, a non-dumpable PID 1)
// are checked from inside by the conformance suite's ChannelAttacks. These tests assume a
// workload got past them anyway and tampered with the host side of the channel directly (the
// test is root on the host): the driver must not follow what it finds there, must recognise a
// peer that is not the box's init, stop the box and leave every other box alone.

// hostSocket is a box's host socket path (the driver's layout).
func hostSocket(t *testing.T, d *gvisor.Driver, id string) string {
	return filepath.Join(stateDirOf(t, d), "boxes", id, "host", "init.sock")
}

// whoami writes each box's id into its workspace, to tell which box an attach reached.
func markBoxes(t *testing.T, d *gvisor.Driver, ids ...string) {
	for _, id := range ids {
		runtimetest.MustRun(t, runtimetest.Client(t, d, id), proto.ExecRequest{Argv: []string{"sh", "-c", "echo " + id + " > whoami"}})
	}
}

func readWhoami(t *testing.T, d *gvisor.Driver, id string) string {
	t.Helper()
	res := runtimetest.MustRun(t, runtimetest.Client(t, d, id), proto.ExecRequest{Argv: []string{"cat", "whoami"}})
	return strings.TrimSpace(string(res.Stdout))
}

// wantTampered checks that attaching to id fails, that the box is failed with a tampering
// reason and its compute is gone, and that starting it again gives a working box.
func wantTampered(t *testing.T, d *gvisor.Driver, id string) {
	t.Helper()
	rwc, err := d.Attach(ctxT(t), id)
	if err == nil {
		rwc.Close()
		t.Fatalf("Attach %s through a tampered channel: got a stream, want an error", id)
	}
	if !errors.Is(err, runtime.ErrNotRunning) || !strings.Contains(err.Error(), "tampered") {
		t.Errorf("Attach: got %v, want ErrNotRunning naming the tampering", err)
	}
	b, err := d.Get(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if b.Phase != runtime.PhaseFailed || !strings.Contains(b.Reason, "tampered") {
		t.Errorf("got phase %s (%s), want failed, tampered with", b.Phase, b.Reason)
	}
	if pid, _ := d.SandboxPid(ctxT(t), id); pid != 0 {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			t.Errorf("the tampered box's sandbox process %d still runs", pid)
		}
	}
	if _, err := d.Start(ctxT(t), id); err != nil {
		t.Fatalf("Start after tampering: %v", err)
	}
	if b, _ := d.Get(ctxT(t), id); b.Phase != runtime.PhaseRunning {
		t.Errorf("after Start: got phase %s (%s), want running", b.Phase, b.Reason)
	}
	if got := readWhoami(t, d, id); got != id {
		t.Errorf("after Start the box reads whoami %q, want %q", got, id)
	}
}

func TestChannelLinkToAnotherBox(t *testing.T) {
	d := newDriver(t)
	a := runtimetest.CreateBox(t, d, defaultSpec())
	b := runtimetest.CreateBox(t, d, defaultSpec())
	markBoxes(t, d, a, b)
	// The issue-13 hijack: A's socket replaced by a relative link to B's.
	sock := hostSocket(t, d, a)
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../"+b+"/host/init.sock", sock); err != nil {
		t.Fatal(err)
	}
	wantTampered(t, d, a)
	if got := readWhoami(t, d, b); got != b {
		t.Errorf("box B reads whoami %q, want %q", got, b)
	}
	if bb, _ := d.Get(ctxT(t), b); bb.Phase != runtime.PhaseRunning {
		t.Errorf("box B is %s (%s), want running", bb.Phase, bb.Reason)
	}
}

func TestChannelFolderLinked(t *testing.T) {
	d := newDriver(t)
	a := runtimetest.CreateBox(t, d, defaultSpec())
	b := runtimetest.CreateBox(t, d, defaultSpec())
	markBoxes(t, d, a, b)
	// The whole host folder replaced by a link to B's.
	dir := filepath.Dir(hostSocket(t, d, a))
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir + ".old") })
	if err := os.Symlink("../"+b+"/host", dir); err != nil {
		t.Fatal(err)
	}
	wantTampered(t, d, a)
	if got := readWhoami(t, d, b); got != b {
		t.Errorf("box B reads whoami %q, want %q", got, b)
	}
}

// impostor listens on path and answers each connection like a guest init: the ready byte, a
// handshake with key (nil: none, as an init of the workload's own would), then the protocol.
func impostor(t *testing.T, path string, key []byte) {
	t.Helper()
	srv, err := server.New(server.Options{Workspace: t.TempDir(), StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_, _ = c.Write([]byte{proto.ConnectReady})
				if key != nil {
					_ = c.SetDeadline(time.Now().Add(5 * time.Second))
					if server.InitHandshake(c, key) != nil {
						c.Close()
						return
					}
					_ = c.SetDeadline(time.Time{})
				}
				srv.ServeConn(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		srv.Close()
	})
}

func TestChannelImpostor(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  func(other []byte) []byte
	}{
		{"NoHandshake", func([]byte) []byte { return nil }},
		{"AnotherBoxKey", func(other []byte) []byte { return other }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriver(t)
			a := runtimetest.CreateBox(t, d, defaultSpec())
			b := runtimetest.CreateBox(t, d, defaultSpec())
			markBoxes(t, d, a, b)
			otherKey, err := os.ReadFile(filepath.Join(stateDirOf(t, d), "boxes", b, "channel.key"))
			if err != nil {
				t.Fatal(err)
			}
			k, err := proto.ParseChannelKey(string(otherKey))
			if err != nil {
				t.Fatal(err)
			}
			sock := hostSocket(t, d, a)
			if err := os.Remove(sock); err != nil {
				t.Fatal(err)
			}
			impostor(t, sock, tc.key(k))
			wantTampered(t, d, a)
			if got := readWhoami(t, d, b); got != b {
				t.Errorf("box B reads whoami %q, want %q", got, b)
			}
		})
	}
}

// A box whose host socket is simply gone attaches through `runsc exec … connect`, which runs
// with no capability and proves the key like the host socket does.
func TestChannelFallback(t *testing.T) {
	d := newDriver(t)
	id := runtimetest.CreateBox(t, d, defaultSpec())
	markBoxes(t, d, id)
	if err := os.Remove(hostSocket(t, d, id)); err != nil {
		t.Fatal(err)
	}
	c := runtimetest.Client(t, d, id) // through the fallback
	res := runtimetest.MustRun(t, c, proto.ExecRequest{Argv: []string{"sh", "-c",
		"cat whoami; for p in $(pgrep -f '^/.sbx/init connect'); do grep CapEff /proc/$p/status; done"}})
	lines := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
	if len(lines) < 2 || lines[0] != id {
		t.Fatalf("got %q, want whoami %s and the connect processes' capabilities", res.Stdout, id)
	}
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) != 2 || strings.Trim(f[1], "0") != "" {
			t.Errorf("a connect process holds capabilities: %q, want none", l)
		}
	}
}

// AttachStream connects through the box's host socket only: exec streams work over it, and
// without the socket it fails at once rather than start a `runsc exec … connect` (a process per
// stream, held while its command runs), while Attach still falls back.
func TestAttachStreamHostSocketOnly(t *testing.T) {
	d := newDriver(t)
	id := runtimetest.CreateBox(t, d, defaultSpec())
	c := runtimetest.Client(t, d, id)
	var dials atomic.Int32
	if !c.UseExecStreams(func(ctx context.Context) (io.ReadWriteCloser, error) { dials.Add(1); return d.AttachStream(ctx, id) }) {
		t.Fatal("the init does not offer exec streams")
	}
	for i := range 3 {
		res := runtimetest.MustRun(t, c, proto.ExecRequest{Argv: []string{"echo", "over a stream"}})
		if string(res.Stdout) != "over a stream\n" {
			t.Fatalf("run %d: %q", i, res.Stdout)
		}
		time.Sleep(50 * time.Millisecond) // the background dial lands
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d exec streams dialled, want 1", n)
	}

	if err := os.Remove(hostSocket(t, d, id)); err != nil {
		t.Fatal(err)
	}
	if rwc, err := d.AttachStream(ctxT(t), id); err == nil {
		rwc.Close()
		t.Fatal("AttachStream without a host socket succeeded")
	}
	rwc, err := d.Attach(ctxT(t), id)
	if err != nil {
		t.Fatalf("Attach's fallback: %v", err)
	}
	rwc.Close()
}

// No command holds CAP_SYS_ADMIN (nor can gain it: not in its bounding set), and PID 1 holds
// it no longer once it is set up. (PID 1's main thread keeps it in its bounding set, which
// matters only at an execve it never makes: commands are forked from the spawner thread.)
func TestInitDropsPrivileges(t *testing.T) {
	d := newDriver(t)
	id := runtimetest.CreateBox(t, d, defaultSpec())
	res := runtimetest.MustRun(t, runtimetest.Client(t, d, id), proto.ExecRequest{Argv: []string{"sh", "-c",
		"grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status; grep -E '^Cap(Eff|Prm)' /proc/1/status; cat /proc/1/task/*/status | grep -E '^Cap(Eff|Prm)'"}})
	const sysAdmin = 1 << 21
	n := 0
	for _, l := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseUint(f[1], 16, 64)
		if err != nil {
			t.Fatalf("bad line %q", l)
		}
		n++
		if v&sysAdmin != 0 {
			t.Errorf("%s holds CAP_SYS_ADMIN", f[0])
		}
	}
	if n < 7 {
		t.Errorf("got %d capability lines (%q), want the command's three, PID 1's two and each thread's", n, res.Stdout)
	}
}

// A box whose container runs without a channel key (started by a sandboxd from before them) is
// failed with the reason, and a start gives it one.
func TestChannelKeylessBoxFails(t *testing.T) {
	d := newDriver(t)
	id := runtimetest.CreateBox(t, d, defaultSpec())
	if err := os.Remove(filepath.Join(stateDirOf(t, d), "boxes", id, "channel.key")); err != nil {
		t.Fatal(err)
	}
	b, err := d.Get(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if b.Phase != runtime.PhaseFailed || !strings.Contains(b.Reason, "older sandboxd") {
		t.Errorf("got phase %s (%s), want failed: started by an older sandboxd", b.Phase, b.Reason)
	}
	if _, err := d.Start(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	runtimetest.MustRun(t, runtimetest.Client(t, d, id), proto.ExecRequest{Argv: []string{"true"}})
}
