package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sandboxd/guest/guesttest"
	"sandboxd/guest/proto"
)

// The attach programs on their own, against a plain unix listener standing in for PID 1: the
// same checks for the init's connect and for its C twin, which the Kubernetes runtime runs
// instead where an image carries it.

// TestConnectRefusesBadKeyLines: a key line that is not 64 hex digits and a newline is
// refused before anything is written or dialled.
func TestConnectRefusesBadKeyLines(t *testing.T) {
	key := proto.EncodeChannelKey(proto.NewChannelKey())
	for _, conn := range connectors(t, buildInit(t)) {
		t.Run(conn.name, func(t *testing.T) {
			for name, in := range map[string]string{
				"short":      key[:10] + "\n",
				"no newline": key + "x",
				"not hex":    strings.Repeat("zz", proto.ChannelKeyLen) + "\n",
				"space":      " " + key[1:] + "\n",
				"empty":      "",
			} {
				dir := t.TempDir()
				cmd := conn.command(proto.ConnectProvision, filepath.Join(dir, "channel.key"))
				cmd.Env = append(os.Environ(), "SBX_SOCKET="+filepath.Join(dir, "none.sock"))
				cmd.Stdin = strings.NewReader(in)
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				start := time.Now()
				err := cmd.Run()
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 1 {
					t.Errorf("%s: got %v (%s), want exit 1", name, err, &stderr)
				}
				if d := time.Since(start); d > 5*time.Second {
					t.Errorf("%s: refused after %v: it dialled first", name, d)
				}
				if conn.name == "c" && !strings.HasPrefix(stderr.String(), proto.ConnectProgramError) {
					t.Errorf("%s: stderr %q does not begin with %q", name, &stderr, proto.ConnectProgramError)
				}
				if ents, _ := os.ReadDir(dir); len(ents) != 0 {
					t.Errorf("%s: files left: %v", name, ents)
				}
			}
		})
	}
}

// TestConnectProvisionsKey: with PID 1 not listening yet, the key lands whole, mode 0400,
// with no temporary file beside it, over a link planted at its path (the link is replaced, its
// target untouched); once PID 1 listens the file is gone and the relay runs; the process holds
// no capability while it relays.
func TestConnectProvisionsKey(t *testing.T) {
	key := proto.EncodeChannelKey(proto.NewChannelKey())
	for _, conn := range connectors(t, buildInit(t)) {
		t.Run(conn.name, func(t *testing.T) {
			dir := t.TempDir()
			sock := filepath.Join(dir, "init.sock")
			keyFile := filepath.Join(dir, "run", "channel.key")
			if err := os.Mkdir(filepath.Dir(keyFile), 0o700); err != nil {
				t.Fatal(err)
			}
			victim := filepath.Join(dir, "victim")
			if err := os.WriteFile(victim, []byte("untouched"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(victim, keyFile); err != nil {
				t.Fatal(err)
			}
			env := append(os.Environ(), "SBX_SOCKET="+sock)
			cmd, s, stderr := startConnect(t, conn, env, proto.ConnectProvision, keyFile)
			defer func() {
				_ = s.Close()
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}()
			if _, err := s.Write([]byte(key + "\n")); err != nil {
				t.Fatal(err)
			}
			var got []byte
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				if fi, err := os.Lstat(keyFile); err == nil && fi.Mode().IsRegular() {
					got, _ = os.ReadFile(keyFile)
					if fi.Mode().Perm() != 0o400 {
						t.Errorf("key file mode %v, want 0400", fi.Mode())
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no key file written (%s)", stderr)
				}
			}
			if string(got) != key {
				t.Errorf("key file %q, want the key", got)
			}
			if b, _ := os.ReadFile(victim); string(b) != "untouched" {
				t.Errorf("the link's target now holds %q", b)
			}
			if ents, _ := os.ReadDir(filepath.Dir(keyFile)); len(ents) != 1 {
				t.Errorf("files beside the key: %v, want the key file only", ents)
			}

			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			served := echoOnce(ln)
			if _, err := s.Read(make([]byte, 0)); err != nil {
				t.Fatalf("no ready byte: %v (%s)", err, stderr)
			}
			if _, err := os.Lstat(keyFile); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the key file once PID 1 listens: %v, want it gone", err)
			}
			for _, field := range []string{"CapEff", "CapPrm", "CapInh"} {
				if v := procStatus(t, cmd.Process.Pid, field); v != "0000000000000000" {
					t.Errorf("%s of the relaying process: %s, want none", field, v)
				}
			}
			if _, err := s.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			_ = s.Close()
			if b, err := readAllOrKill(t, s, cmd); err != nil || string(b) != "ping" {
				t.Errorf("echo through the relay: %q %v", b, err)
			}
			if err := waitExit(t, cmd, 10*time.Second); err != nil {
				t.Errorf("exit after PID 1 closed: %v (%s)", err, stderr)
			}
			if err := <-served; err != nil {
				t.Error(err)
			}
		})
	}
}

// TestConnectRelaysBothWays: 8 MiB each way, in chunks of every size, arrive whole and in
// order; the host's end of stdin reaches PID 1 as a half-close, and PID 1's close ends the
// program with status 0.
func TestConnectRelaysBothWays(t *testing.T) {
	for _, conn := range connectors(t, buildInit(t)) {
		t.Run(conn.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "init.sock")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			// PID 1's side: sends its own 8 MiB while it reads the host's, then closes once
			// the host's half-close arrived, answering with the digest of what it read.
			down := make([]byte, 8<<20)
			_, _ = rand.Read(down)
			type result struct {
				sum [sha256.Size]byte
				err error
			}
			peer := make(chan result, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					peer <- result{err: err}
					return
				}
				defer c.Close()
				sent := make(chan error, 1)
				go func() { _, err := c.Write(down); sent <- err }()
				h := sha256.New()
				_, err = io.Copy(h, c)
				if serr := <-sent; err == nil {
					err = serr
				}
				var r result
				copy(r.sum[:], h.Sum(nil))
				r.err = err
				peer <- r
			}()
			cmd, s, stderr := startConnect(t, conn, append(os.Environ(), "SBX_SOCKET="+sock))
			up := make([]byte, 8<<20)
			_, _ = rand.Read(up)
			go func() {
				for off, n := 0, 1; off < len(up); off, n = off+n, n*2%65521+1 {
					end := min(off+n, len(up))
					if _, err := s.Write(up[off:end]); err != nil {
						return
					}
				}
				_ = s.Close()
			}()
			got, err := readAllOrKill(t, s, cmd)
			if err != nil || !bytes.Equal(got, down) {
				t.Errorf("PID 1's bytes on stdout: %d of %d, equal %v, %v", len(got), len(down), bytes.Equal(got, down), err)
			}
			r := <-peer
			if r.err != nil || r.sum != sha256.Sum256(up) {
				t.Errorf("the host's bytes at PID 1: digest equal %v, %v", r.sum == sha256.Sum256(up), r.err)
			}
			if err := waitExit(t, cmd, 10*time.Second); err != nil {
				t.Errorf("exit: %v (%s)", err, stderr)
			}
		})
	}
}

// TestConnectProgramCommandLine: the C program takes nothing but `provision KEYFILE` (exit 2
// otherwise) and refuses a socket name no address can hold.
func TestConnectProgramCommandLine(t *testing.T) {
	bin := guesttest.Connect(t)
	for _, args := range [][]string{{"x"}, {proto.ConnectProvision}, {proto.ConnectProvision, ""}, {proto.ConnectProvision, "a", "b"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.HasPrefix(string(out), "usage: ") {
			t.Errorf("%q: got %v (%s), want exit 2 and the usage", args, err, out)
		}
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{"SBX_SOCKET=/" + strings.Repeat("a", 200)}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.HasPrefix(string(out), proto.ConnectProgramError) {
		t.Errorf("a socket name too long: got %v (%s), want exit 1 and its error", err, out)
	}
}

// readAllOrKill reads r to its end; when that takes more than 10 s (the relay never ended),
// it kills cmd, whose output r is, and fails the test.
func readAllOrKill(t *testing.T, r io.Reader, cmd *exec.Cmd) ([]byte, error) {
	t.Helper()
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		b, err := io.ReadAll(r)
		done <- result{b, err}
	}()
	select {
	case res := <-done:
		return res.b, res.err
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		res := <-done
		t.Errorf("%s: its output did not end within 10s", cmd.Args)
		return res.b, res.err
	}
}

// echoOnce accepts one connection on ln and writes back what it reads until the reader's end.
func echoOnce(ln net.Listener) <-chan error {
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		_, err = io.Copy(c, c)
		done <- err
	}()
	return done
}

// procStatus is the value of field in /proc/PID/status.
func procStatus(t *testing.T, pid int, field string) string {
	t.Helper()
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && k == field {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return ""
}
