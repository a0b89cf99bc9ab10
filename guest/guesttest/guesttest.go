// Package guesttest is test-only: a real guest init server on the host with a client over one
// stream (Harness), and the helpers the tests of guest/server and guest/client share.
package guesttest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
)

// Harness is a real server on the host (Reap as asked) with its own temp workspace and state
// dir, and a client over one stream.
type Harness struct {
	Srv   *server.Server
	C     *client.Client
	WS    string
	State string
	// ServerEnd is the server's end of the stream (closing it breaks the attach).
	ServerEnd net.Conn
}

// Transport is what carries the stream between the client and the server.
type Transport int

const (
	OverSocketpair Transport = iota
	OverNetPipe
)

// New starts a Harness; t's cleanup closes the client and the server.
func New(t testing.TB, opts server.Options, tr Transport) *Harness {
	t.Helper()
	return NewWrapped(t, opts, tr, nil)
}

// NewWrapped is New with the server serving wrap(its end of the stream) when wrap is not nil:
// a test's view of what the server reads and writes.
func NewWrapped(t testing.TB, opts server.Options, tr Transport, wrap func(net.Conn) net.Conn) *Harness {
	t.Helper()
	h := &Harness{WS: t.TempDir(), State: TmpfsDir(t)}
	opts.Workspace, opts.StateDir = h.WS, h.State
	opts.Logger = slog.New(slog.DiscardHandler)
	srv, err := server.New(opts)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	h.Srv = srv
	if opts.Spawner != "" {
		// What PID 1 does at its start: the spawner program starts the execs from here on.
		if err := srv.Warm(); err != nil {
			srv.Close()
			t.Fatalf("starting the spawner program: %v", err)
		}
	}
	var clientEnd net.Conn
	switch tr {
	case OverNetPipe:
		h.ServerEnd, clientEnd = net.Pipe()
	default:
		h.ServerEnd, clientEnd = Socketpair(t)
	}
	served := make(chan struct{})
	serverEnd := h.ServerEnd
	if wrap != nil {
		serverEnd = wrap(serverEnd)
	}
	go func() {
		defer close(served)
		srv.ServeConn(serverEnd)
	}()
	c, err := client.Dial(clientEnd)
	if err != nil {
		srv.Close()
		t.Fatalf("Dial: %v", err)
	}
	h.C = c
	t.Cleanup(func() {
		_ = c.Close()
		srv.Close()
		<-served
	})
	return h
}

// TmpfsDir is a state dir on a tmpfs when there is one, as inside a sandbox (/run/sbx).
func TmpfsDir(t testing.TB) string {
	d, err := os.MkdirTemp("/dev/shm", "sbx-state-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// Socketpair is a connected pair of unix stream sockets.
func Socketpair(t testing.TB) (net.Conn, net.Conn) {
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

// Ctx is a context that ends after d or with t.
func Ctx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Records reads a whole log from offset (following or not).
func Records(t testing.TB, c *client.Client, id string, off int64, follow bool) []client.Record {
	t.Helper()
	lr, err := c.Log(Ctx(t, 30*time.Second), id, off, follow)
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

// LiveProcs lists the live (not zombie) processes whose /proc/<pid>/<file> (NUL-separated
// fields: environ, cmdline) has a field for which match is true.
func LiveProcs(file string, match func(field []byte) bool) []int {
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

// TreeLeft lists the live processes that carry SBX_EXEC_ID=<id>.
func TreeLeft(id string) []int {
	want := []byte(proto.ExecIDEnv + "=" + id)
	return LiveProcs("environ", func(kv []byte) bool { return bytes.Equal(kv, want) })
}

// WaitTreeGone fails unless no process of the exec is left within a short grace.
func WaitTreeGone(t testing.TB, id string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		left := TreeLeft(id)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes of exec %s left: got %v, want none", id, left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Streams counts what a harness's exec streams carried.
type Streams struct {
	dials atomic.Int64
	read  atomic.Int64
}

// Dials is how many streams were opened; Read how many bytes the client read from them.
func (s *Streams) Dials() int  { return int(s.dials.Load()) }
func (s *Streams) Read() int64 { return s.read.Load() }

// UseExecStreams makes the harness's client start commands over exec streams, each a new
// socketpair whose server end the server serves (guest/proto/stream.go).
func (h *Harness) UseExecStreams(t testing.TB) *Streams {
	t.Helper()
	st := &Streams{}
	ok := h.C.UseExecStreams(func(ctx context.Context) (io.ReadWriteCloser, error) {
		st.dials.Add(1)
		serverEnd, clientEnd := Socketpair(t)
		go h.Srv.ServeConn(serverEnd)
		return countingConn{Conn: clientEnd, n: &st.read}, nil
	})
	if !ok {
		t.Fatal("the server's health does not offer exec streams")
	}
	return st
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// cBuilds holds, per program, the one build of a test binary's guest C program.
var cBuilds struct {
	mu     sync.Mutex
	byName map[string]*cBuild
}

type cBuild struct {
	once sync.Once
	path string
	err  error
}

// Spawner returns the spawner program (guest/spawner/spawner.c), built as cProgram says.
func Spawner(t testing.TB) string {
	t.Helper()
	return cProgram(t, "spawner", "sandbox-spawn")
}

// Connect returns the connect program (guest/connect/connect.c), built as cProgram says.
func Connect(t testing.TB) string {
	t.Helper()
	return cProgram(t, "connect", "sandbox-connect")
}

// cProgram returns the guest C program guest/NAME/NAME.c built by scripts/build-guest-c.sh,
// once per test binary, into the cache folder under a name its source's hash gives (so runs
// share it and a changed source is built anew), as file.
func cProgram(t testing.TB, name, file string) string {
	t.Helper()
	cBuilds.mu.Lock()
	if cBuilds.byName == nil {
		cBuilds.byName = map[string]*cBuild{}
	}
	b := cBuilds.byName[name]
	if b == nil {
		b = &cBuild{}
		cBuilds.byName[name] = b
	}
	cBuilds.mu.Unlock()
	b.once.Do(func() { b.path, b.err = buildC(name, file) })
	if b.err != nil {
		t.Fatalf("building the %s program: %v", name, b.err)
	}
	return b.path
}

func buildC(name, file string) (string, error) {
	repo, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(repo, "go.mod")); err == nil {
			break
		}
		up := filepath.Dir(repo)
		if up == repo {
			return "", errors.New("no go.mod above the test's folder")
		}
		repo = up
	}
	src, err := os.ReadFile(filepath.Join(repo, "guest", name, name+".c"))
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(src)
	cache := os.Getenv("SANDBOXD_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		cache = filepath.Join(home, ".cache", "sandboxd")
	}
	out := filepath.Join(cache, "test-"+name, hex.EncodeToString(sum[:8]), file)
	if fi, err := os.Stat(out); err == nil && fi.Mode().IsRegular() {
		return out, nil
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", err
	}
	cmd := exec.Command(filepath.Join(repo, "scripts", "build-guest-c.sh"), name, out)
	cmd.Dir = repo
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%v: %s", err, b)
	}
	return out, nil
}
