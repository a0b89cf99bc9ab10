package main

import (
	"context"
	"errors"
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
	serve := exec.Command(bin, "serve")
	serve.Env = append(os.Environ(), "SBX_SOCKET="+sock, "SBX_STATE_DIR="+filepath.Join(dir, "state"),
		"SBX_WORKSPACE="+filepath.Join(dir, "ws"), "SBX_REAP=0", proto.ChannelKeyFileEnv+"="+keyFile)
	serveErr := &lockedBuffer{}
	serve.Stderr = serveErr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = serve.Process.Kill()
		_ = serve.Wait()
	}()
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
	if err := client.HostHandshake(c, key); err != nil {
		t.Fatalf("handshake with the key: %v (%s)", err, serveErr)
	}
	_ = c.SetDeadline(time.Time{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gc, err := client.DialContext(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gc.Health(ctx); err != nil {
		t.Errorf("Health after the handshake: %v", err)
	}
	gc.Close()

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
