package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
)

// TestServeChannelKey: with a key file the init takes (deletes) it at start, serves a caller
// that proves the key, and closes on one that does not.
func TestServeChannelKey(t *testing.T) {
	bin := buildInit(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "init.sock")
	keyFile := filepath.Join(dir, "channel.key")
	key := proto.NewChannelKey()
	if err := os.WriteFile(keyFile, []byte(proto.EncodeChannelKey(key)), 0o400); err != nil {
		t.Fatal(err)
	}
	serveErr := startServe(t, bin, keyEnv(dir, sock, keyFile))
	var c net.Conn
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		if c, err = net.Dial("unix", sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the init does not listen: %v (%s)", err, serveErr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Stat(keyFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the key file after the init started: %v, want it deleted", err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	provesAndServes(t, c, key, serveErr)

	// Without the key: the other key fails the handshake; raw HTTP/2 gets nothing.
	c2, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	_ = c2.SetDeadline(time.Now().Add(10 * time.Second))
	if err := client.HostHandshake(c2, proto.NewChannelKey()); !errors.Is(err, proto.ErrImpostor) {
		t.Errorf("handshake with another key: got %v, want ErrImpostor (the init's proof fails)", err)
	}
	c2.Close()
	c3, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	_ = c3.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = c3.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	if n, _ := c3.Read(make([]byte, 64)); n != 0 {
		t.Errorf("a keyless caller got %d bytes, want the connection closed", n)
	}
	c3.Close()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(serveErr.String(), "did not prove the channel key"); {
		if time.Now().After(deadline) {
			t.Errorf("the init's log does not mention the refused caller: %s", serveErr)
			break
		}
		time.Sleep(10 * time.Millisecond) // the log reaches us through a pipe
	}
}

// keyEnv is the environment of an init serving on sock over the folder dir, its key in keyFile.
func keyEnv(dir, sock, keyFile string) []string {
	return append(os.Environ(), "SBX_SOCKET="+sock, "SBX_STATE_DIR="+filepath.Join(dir, "state"),
		"SBX_WORKSPACE="+filepath.Join(dir, "ws"), "SBX_REAP=0", proto.ChannelKeyFileEnv+"="+keyFile)
}

// startServe starts `serve` with env until the test ends and returns its stderr.
func startServe(t *testing.T, bin string, env []string) *lockedBuffer {
	t.Helper()
	serve := exec.Command(bin, "serve")
	serve.Env = env
	serveErr := &lockedBuffer{}
	serve.Stderr = serveErr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = serve.Process.Kill()
		_ = serve.Wait()
	})
	return serveErr
}

// provesAndServes proves key over rwc to the init at its other end and checks that it then
// answers the protocol; rwc is closed after (logs: the processes' output, for a failure).
func provesAndServes(t *testing.T, rwc io.ReadWriteCloser, key []byte, logs ...fmt.Stringer) {
	t.Helper()
	if err := client.HostHandshake(rwc, key); err != nil {
		t.Fatalf("handshake with the key: %v (%v)", err, logs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gc, err := client.DialContext(ctx, rwc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gc.Health(ctx); err != nil {
		t.Errorf("Health after the handshake: %v", err)
	}
	gc.Close()
}

// TestServeRequiresContainment: a runtime that requires containment gets no server from an
// init that cannot set it up (here: not PID 1).
func TestServeRequiresContainment(t *testing.T) {
	bin := buildInit(t)
	dir := t.TempDir()
	serve := exec.Command(bin, "serve")
	serve.Env = append(os.Environ(), "SBX_SOCKET="+filepath.Join(dir, "init.sock"), "SBX_STATE_DIR="+filepath.Join(dir, "state"),
		"SBX_WORKSPACE="+filepath.Join(dir, "ws"), proto.RequireContainmentEnv+"=1")
	out, err := serve.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "requires containment") {
		t.Errorf("got %v: %s, want exit 1 saying containment is required", err, out)
	}
}

// TestInstallWritesChannelKey: the Kubernetes init container's install also writes the pod's
// key where PID 1 takes it, and refuses a malformed one.
func TestInstallWritesChannelKey(t *testing.T) {
	bin := buildInit(t)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "channel.key")
	key := proto.EncodeChannelKey(proto.NewChannelKey())
	cmd := exec.Command(bin, "install", filepath.Join(dir, "init"))
	cmd.Env = append(os.Environ(), proto.ChannelKeyEnv+"="+key, proto.ChannelKeyFileEnv+"="+keyFile)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("install: %v (%s)", err, out)
	}
	b, err := os.ReadFile(keyFile)
	if err != nil || string(b) != key {
		t.Errorf("key file: got %q (%v), want the key", b, err)
	}
	if st, err := os.Stat(keyFile); err != nil || st.Mode().Perm() != 0o400 {
		t.Errorf("key file mode %v (%v), want 0400", st.Mode(), err)
	}
	cmd = exec.Command(bin, "install", filepath.Join(dir, "init2"))
	cmd.Env = append(os.Environ(), proto.ChannelKeyEnv+"=not-hex", proto.ChannelKeyFileEnv+"="+filepath.Join(dir, "k2"))
	if err := cmd.Run(); err == nil {
		t.Errorf("install with a malformed key succeeded, want an error")
	}
}

// TestServeAwaitsProvisionedKey: a PID 1 told to wait for its key (no init container wrote
// it) does not listen until `connect provision` brings it; the key file is gone once the init
// answers, and the init then serves only callers that prove that key.
func TestServeAwaitsProvisionedKey(t *testing.T) {
	bin := buildInit(t)
	for _, conn := range connectors(t, bin) {
		t.Run(conn.name, func(t *testing.T) { awaitsProvisionedKey(t, bin, conn) })
	}
}

func awaitsProvisionedKey(t *testing.T, bin string, conn connector) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "init.sock")
	keyFile := filepath.Join(dir, "channel.key")
	env := keyEnv(dir, sock, keyFile)
	serveErr := startServe(t, bin, append(env, proto.ChannelKeyAwaitEnv+"=1"))
	time.Sleep(300 * time.Millisecond)
	if c, err := net.Dial("unix", sock); err == nil {
		c.Close()
		t.Fatalf("the init listens before it has its key")
	}

	key := proto.NewChannelKey()
	cmd, s, connErr := startConnect(t, conn, env, proto.ConnectProvision, keyFile)
	defer func() {
		_ = s.Close()
		_ = cmd.Wait()
	}()
	if _, err := s.Write([]byte(proto.EncodeChannelKey(key) + "\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Read(make([]byte, 0)); err != nil {
		t.Fatalf("no ready byte: %v (connect: %s; serve: %s)", err, connErr, serveErr)
	}
	if _, err := os.Stat(keyFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the key file once the init answers: %v, want it gone", err)
	}
	provesAndServes(t, s, key, serveErr, connErr)

	// A second provisioning, once the init listens, writes nothing: the other key it brings
	// does not become the init's, and no file is left.
	other := conn.command(proto.ConnectProvision, keyFile)
	other.Env = env
	other.Stdin = strings.NewReader(proto.EncodeChannelKey(proto.NewChannelKey()) + "\n")
	_ = other.Run()
	if _, err := os.Stat(keyFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the key file after a second provisioning: %v, want none", err)
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := client.HostHandshake(c, key); err != nil {
		t.Errorf("handshake with the first key after a second provisioning: %v", err)
	}
}

// TestProvision: the key line is checked before anything is written; a listening init gets
// nothing written; otherwise the key lands whole, mode 0400, with no temporary file left.
func TestProvision(t *testing.T) {
	key := proto.EncodeChannelKey(proto.NewChannelKey())
	refused := func() (*net.UnixConn, error) { return nil, errors.New("not listening") }
	for name, in := range map[string]string{
		"short":      key[:10] + "\n",
		"no newline": key + "x",
		"not hex":    strings.Repeat("zz", proto.ChannelKeyLen) + "\n",
		"empty":      "",
	} {
		dir := t.TempDir()
		if _, err := provision(strings.NewReader(in), filepath.Join(dir, "channel.key"), refused); err == nil {
			t.Errorf("%s: provision accepted %q", name, in)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("%s: files left: %v", name, ents)
		}
	}

	dir := t.TempDir()
	kf := filepath.Join(dir, "channel.key")
	c, err := provision(strings.NewReader(key+"\nrest"), kf, refused)
	if err != nil || c != nil {
		t.Fatalf("provision: %v %v", c, err)
	}
	b, err := os.ReadFile(kf)
	if err != nil || string(b) != key {
		t.Errorf("key file %q (%v), want the key", b, err)
	}
	if st, err := os.Stat(kf); err != nil || st.Mode().Perm() != 0o400 {
		t.Errorf("key file mode %v (%v), want 0400", st.Mode(), err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("files in the folder: %v, want the key file only", ents)
	}

	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir = t.TempDir()
	c, err = provision(strings.NewReader(key+"\n"), filepath.Join(dir, "channel.key"), func() (*net.UnixConn, error) {
		return net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	})
	if err != nil || c == nil {
		t.Fatalf("provision to a listening init: %v %v, want its connection", c, err)
	}
	c.Close()
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("provision to a listening init wrote %v", ents)
	}
}
