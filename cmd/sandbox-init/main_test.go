package main

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sandboxd/guest/client"
	"sandboxd/guest/guesttest"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// buildInit builds the binary the way the runtime ships it: static, CGO_ENABLED=0.
func buildInit(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "sandbox-init")
	cmd := exec.Command(goTool, "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// stdioStream is the host's view of `sandbox-init connect`: write its stdin, read its stdout.
type stdioStream struct {
	io.Reader
	io.WriteCloser
}

// connector is one of the two programs that do the runtime's attach: the init's own
// `connect`, and its C twin (guest/connect), which must behave the same.
type connector struct {
	name string
	argv []string
}

func (c connector) command(args ...string) *exec.Cmd {
	return exec.Command(c.argv[0], append(append([]string{}, c.argv[1:]...), args...)...)
}

// connectors are both, bin being the init.
func connectors(t *testing.T, bin string) []connector {
	return []connector{{"init", []string{bin, "connect"}}, {"c", []string{guesttest.Connect(t)}}}
}

func startConnect(t *testing.T, conn connector, env []string, args ...string) (*exec.Cmd, *stdioStream, *bytes.Buffer) {
	t.Helper()
	cmd := conn.command(args...)
	cmd.Env = env
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, &stdioStream{Reader: &readyReader{r: stdout}, WriteCloser: stdin}, &stderr
}

// readyReader checks and drops the ready byte before the protocol's first byte, as a driver does.
type readyReader struct {
	r    io.Reader
	seen bool
}

func (r *readyReader) Read(p []byte) (int, error) {
	if !r.seen {
		if err := client.AwaitReady(r.r); err != nil {
			return 0, err
		}
		r.seen = true
	}
	return r.r.Read(p)
}

func waitExit(t *testing.T, cmd *exec.Cmd, d time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%s did not exit within %v", cmd.Args, d)
		return nil
	}
}

// lockedBuffer collects a subprocess's stderr while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestBinary(t *testing.T) {
	bin := buildInit(t)

	t.Run("static", func(t *testing.T) {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("program header %v: got a dynamic binary, want static", p.Type)
			}
		}
	})

	t.Run("version", func(t *testing.T) {
		for _, arg := range []string{"version", "--version"} {
			out, err := exec.Command(bin, arg).Output()
			want := "sandbox-init " + server.Version + " ("
			if err != nil || !strings.HasPrefix(string(out), want) || !strings.Contains(string(out), goruntime.Version()) {
				t.Errorf("%s: got %q %v, want %q… with the Go version", arg, out, err, want)
			}
		}
	})

	for _, conn := range connectors(t, bin) {
		t.Run("connect="+conn.name, func(t *testing.T) { serveOverConnect(t, bin, conn) })
	}
}

// serveOverConnect runs the init's server and drives it through conn: the protocol, an exec
// that outlives its attach, a reattach, and the ends of both at SIGTERM.
func serveOverConnect(t *testing.T, bin string, conn connector) {
	dir := t.TempDir()
	ws := filepath.Join(dir, "ws")
	sock := filepath.Join(dir, "run", "init.sock")
	env := append(os.Environ(),
		"SBX_SOCKET="+sock,
		"SBX_STATE_DIR="+filepath.Join(dir, "state"),
		"SBX_WORKSPACE="+ws,
		"SBX_REAP=1",
	)
	// A stale socket file from an earlier run is replaced.
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	// connect starts first: it retries until PID 1 listens.
	conn1, stream1, conn1Err := startConnect(t, conn, env)
	time.Sleep(300 * time.Millisecond)

	serve := exec.Command(bin, "serve")
	serve.Env = env
	serveErr := &lockedBuffer{}
	serve.Stderr = serveErr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if serve.ProcessState == nil {
			_ = serve.Process.Kill()
			_ = serve.Wait()
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.DialContext(ctx, stream1)
	if err != nil {
		t.Fatalf("Dial over connect: %v (connect: %s; serve: %s)", err, conn1Err, serveErr)
	}
	h, err := c.Health(ctx)
	if err != nil || h.Pid != serve.Process.Pid {
		t.Fatalf("Health: got %+v %v, want pid %d", h, err, serve.Process.Pid)
	}

	res, err := c.Run(ctx, proto.ExecRequest{ID: "hello", Argv: []string{"sh", "-c", `echo "hi $SBX_EXEC_ID [$SBX_SOCKET] $(pwd)"; echo oops >&2; exit 7`}}, 0, 0)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if want := "hi hello [] " + ws + "\n"; string(res.Stdout) != want || string(res.Stderr) != "oops\n" || res.Exit.ExitCode != 7 {
		t.Errorf("Run: got %q %q %d, want %q oops 7", res.Stdout, res.Stderr, res.Exit.ExitCode, want)
	}

	res, err = c.Run(ctx, proto.ExecRequest{ID: "timeout", Argv: []string{"sh", "-c", "setsid sleep 100 & sleep 100"}, TimeoutMs: 200}, 0, 0)
	if err != nil || !res.Exit.TimedOut || res.Exit.ExitCode != 137 {
		t.Errorf("timeout: got %+v %v, want timed out with 137", res.Exit, err)
	}

	if _, err := c.WriteFile(ctx, "dir/file.txt", 0o600, strings.NewReader("content")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	rc, _, err := c.ReadFile(ctx, "/workspace/dir/file.txt")
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "content" {
		t.Errorf("ReadFile: got %q, want content", b)
	}
	tarball, err := c.ExportWorkspace(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, tarball)
	tarball.Close()
	if err != nil || n == 0 {
		t.Errorf("ExportWorkspace: got %d bytes, %v", n, err)
	}

	// A long-running exec outlives its attach.
	if _, err := c.StartExec(ctx, proto.ExecRequest{ID: "long", Argv: []string{"sh", "-c", "sleep 0.5; echo later"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		t.Logf("Close: %v", err)
	}
	if err := waitExit(t, conn1, 10*time.Second); err != nil {
		t.Errorf("connect after the host closed its stdin: %v (%s)", err, conn1Err)
	}

	// Reattach: a second connect finds the exec and its whole output.
	conn2, stream2, _ := startConnect(t, conn, env)
	c2, err := client.DialContext(ctx, stream2)
	if err != nil {
		t.Fatalf("second Dial: %v", err)
	}
	lr, err := c2.Log(ctx, "long", 0, true)
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for {
		rec, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Kind == proto.RecordStdout {
			out = append(out, rec.Data...)
		}
	}
	lr.Close()
	if string(out) != "later\n" {
		t.Errorf("reattached log: got %q, want later", out)
	}

	// SIGTERM: the server closes, connect sees the socket close, both exit 0.
	if err := serve.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := waitExit(t, serve, 10*time.Second); err != nil {
		t.Errorf("serve after SIGTERM: %v, want exit 0 (%s)", err, serveErr)
	}
	if err := waitExit(t, conn2, 10*time.Second); err != nil {
		t.Errorf("connect after the server stopped: %v", err)
	}
	select {
	case <-c2.Done():
	case <-time.After(5 * time.Second):
		t.Error("client: Done not closed after the server stopped")
	}
	_ = c2.Close()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket after stop: got %v, want removed", err)
	}
}

func TestConnectGivesUp(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 10 s")
	}
	for _, conn := range connectors(t, buildInit(t)) {
		t.Run(conn.name, func(t *testing.T) {
			t.Parallel()
			cmd := conn.command()
			cmd.Env = append(os.Environ(), "SBX_SOCKET="+filepath.Join(t.TempDir(), "none.sock"))
			start := time.Now()
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Errorf("connect without a server: got %v (%s), want exit 1", err, out)
			}
			if d := time.Since(start); d < 9*time.Second || d > 20*time.Second {
				t.Errorf("connect gave up after %v, want about 10s", d)
			}
		})
	}
}

func TestInstallCopiesItself(t *testing.T) {
	bin := buildInit(t)
	dest := filepath.Join(t.TempDir(), "init")
	if out, err := exec.Command(bin, "install", dest).CombinedOutput(); err != nil {
		t.Fatalf("install: %v (%s)", err, out)
	}
	want, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dest)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("installed %d bytes, want the binary's %d", len(got), len(want))
	}
	if st, err := os.Stat(dest); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("installed mode %v (%v), want 0755", st.Mode(), err)
	}
	out, err := exec.Command(dest, "version").Output()
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		t.Errorf("installed binary's version: %q, %v", out, err)
	}
	entries, _ := os.ReadDir(filepath.Dir(dest))
	if len(entries) != 1 {
		t.Errorf("install left %d entries in the folder, want only the binary", len(entries))
	}
	if err := exec.Command(bin, "install").Run(); err == nil {
		t.Errorf("install without DEST succeeded, want a usage error")
	}
}
