package server_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// harness is a real server on the host (Reap as asked) with its own temp workspace and state
// dir, and a client over one stream.
type harness struct {
	srv   *server.Server
	c     *client.Client
	ws    string
	state string
	// serverEnd is the server's end of the stream (closing it breaks the attach).
	serverEnd net.Conn
}

type transport int

const (
	overSocketpair transport = iota
	overNetPipe
)

func newHarness(t testing.TB, opts server.Options, tr transport) *harness {
	t.Helper()
	h := &harness{ws: t.TempDir(), state: tmpfsDir(t)}
	opts.Workspace, opts.StateDir = h.ws, h.state
	opts.Logger = slog.New(slog.DiscardHandler)
	srv, err := server.New(opts)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	h.srv = srv
	var clientEnd net.Conn
	switch tr {
	case overNetPipe:
		h.serverEnd, clientEnd = net.Pipe()
	default:
		h.serverEnd, clientEnd = socketpair(t)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.ServeConn(h.serverEnd)
	}()
	c, err := client.Dial(clientEnd)
	if err != nil {
		srv.Close()
		t.Fatalf("Dial: %v", err)
	}
	h.c = c
	t.Cleanup(func() {
		_ = c.Close()
		srv.Close()
		<-served
	})
	return h
}

// tmpfsDir is a state dir on a tmpfs when there is one, as inside a sandbox (/run/sbx).
func tmpfsDir(t testing.TB) string {
	d, err := os.MkdirTemp("/dev/shm", "sbx-state-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

func socketpair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socketpair: %v", err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		_ = f.Close()
		if err != nil {
			t.Fatalf("FileConn: %v", err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

// modes runs f once per process-waiting strategy.
func modes(t *testing.T, f func(t *testing.T, reap bool)) {
	for _, reap := range []bool{false, true} {
		name := "wait"
		if reap {
			name = "reap"
		}
		t.Run(name, func(t *testing.T) { f(t, reap) })
	}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// records reads a whole log from offset (following or not).
func records(t testing.TB, c *client.Client, id string, off int64, follow bool) []client.Record {
	t.Helper()
	lr, err := c.Log(ctxT(t, 30*time.Second), id, off, follow)
	if err != nil {
		t.Fatalf("Log(%s, %d): %v", id, off, err)
	}
	defer lr.Close()
	var out []client.Record
	for {
		rec, err := lr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		out = append(out, rec)
	}
}

// liveProcs lists the live (not zombie) processes whose /proc/<pid>/<file> (NUL-separated
// fields: environ, cmdline) has a field for which match is true.
func liveProcs(file string, match func(field []byte) bool) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/" + file)
		if err != nil {
			continue
		}
		if slices.ContainsFunc(bytes.Split(b, []byte{0}), match) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// treeLeft lists the live processes that carry SBX_EXEC_ID=<id>.
func treeLeft(id string) []int {
	want := []byte(proto.ExecIDEnv + "=" + id)
	return liveProcs("environ", func(kv []byte) bool { return bytes.Equal(kv, want) })
}

// waitTreeGone fails unless no process of the exec is left within a short grace.
func waitTreeGone(t testing.TB, id string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		left := treeLeft(id)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes of exec %s left: got %v, want none", id, left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func wantCode(t testing.TB, err error, code string) {
	t.Helper()
	var ge *proto.Error
	if !errors.As(err, &ge) {
		t.Fatalf("error: got %v, want a *proto.Error with code %s", err, code)
	}
	if ge.Code != code {
		t.Fatalf("error code: got %s (%s), want %s", ge.Code, ge.Message, code)
	}
}

func writeTree(t testing.TB, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(name, "/") {
			continue
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
