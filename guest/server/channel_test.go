package server

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
)

// handshake runs both sides over a pipe and returns their errors.
func handshake(t *testing.T, hostKey, initKey []byte) (hostErr, initErr error) {
	t.Helper()
	h, i := net.Pipe()
	defer h.Close()
	defer i.Close()
	deadline := time.Now().Add(5 * time.Second)
	_ = h.SetDeadline(deadline)
	_ = i.SetDeadline(deadline)
	done := make(chan error, 1)
	go func() {
		err := InitHandshake(i, initKey)
		if err != nil {
			i.Close() // as the init does: the host then sees the stream end
		}
		done <- err
	}()
	hostErr = client.HostHandshake(h, hostKey)
	if hostErr != nil {
		h.Close()
	}
	return hostErr, <-done
}

func TestHandshake(t *testing.T) {
	key := proto.NewChannelKey()
	other := proto.NewChannelKey()
	t.Run("SameKey", func(t *testing.T) {
		if herr, ierr := handshake(t, key, key); herr != nil || ierr != nil {
			t.Fatalf("got host %v, init %v, want both nil", herr, ierr)
		}
	})
	t.Run("InitWithAnotherKey", func(t *testing.T) {
		// Another box's init, reached through a redirected path.
		herr, ierr := handshake(t, key, other)
		if !errors.Is(herr, proto.ErrImpostor) {
			t.Errorf("got host error %v, want ErrImpostor", herr)
		}
		if ierr == nil {
			t.Errorf("got init error nil, want the stream to end before the host's proof")
		}
	})
	t.Run("HostWithAnotherKey", func(t *testing.T) {
		// Not reachable when the host checks first, but the init never trusts a caller.
		h, i := net.Pipe()
		defer h.Close()
		_ = h.SetDeadline(time.Now().Add(5 * time.Second))
		_ = i.SetDeadline(time.Now().Add(5 * time.Second))
		done := make(chan error, 1)
		go func() { done <- InitHandshake(i, key); i.Close() }()
		nonce := bytes.Repeat([]byte{7}, proto.NonceLen)
		if _, err := h.Write(append(append([]byte{}, proto.HandshakeHostHello...), nonce...)); err != nil {
			t.Fatal(err)
		}
		msg := make([]byte, len(proto.HandshakeInitHello)+proto.NonceLen+proto.MACLen)
		if _, err := io.ReadFull(h, msg); err != nil {
			t.Fatal(err)
		}
		initNonce := msg[len(proto.HandshakeInitHello) : len(proto.HandshakeInitHello)+proto.NonceLen]
		if _, err := h.Write(proto.HandshakeMAC(other, "sandboxd host", nonce, initNonce)); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, ErrHostUnproven) {
			t.Errorf("got init error %v, want ErrHostUnproven", err)
		}
		var b [1]byte
		if n, _ := h.Read(b[:]); n != 0 {
			t.Errorf("got %d bytes after a wrong proof, want the stream closed", n)
		}
	})
	t.Run("ImpostorSpeaksHTTP2", func(t *testing.T) {
		// A guest server without the key (a workload running the init binary itself) answers
		// the host's greeting with its HTTP/2 preface, never with a proof.
		h, i := net.Pipe()
		defer h.Close()
		defer i.Close()
		_ = h.SetDeadline(time.Now().Add(5 * time.Second))
		go func() {
			buf := make([]byte, 64)
			_, _ = i.Read(buf)
			_, _ = i.Write([]byte("\x00\x00\x12\x04\x00\x00\x00\x00\x00" + "settings-frame...."))
		}()
		if err := client.HostHandshake(h, key); !errors.Is(err, proto.ErrImpostor) {
			t.Errorf("got %v, want ErrImpostor", err)
		}
	})
	t.Run("ProofIsNotReplayable", func(t *testing.T) {
		// The init's proof covers the host's fresh nonce: a recording of one attach does not
		// answer the next one.
		hostNonce1 := bytes.Repeat([]byte{1}, proto.NonceLen)
		hostNonce2 := bytes.Repeat([]byte{2}, proto.NonceLen)
		initNonce := bytes.Repeat([]byte{3}, proto.NonceLen)
		if bytes.Equal(proto.HandshakeMAC(key, "sandboxd init", hostNonce1, initNonce), proto.HandshakeMAC(key, "sandboxd init", hostNonce2, initNonce)) {
			t.Error("got the same proof for two host nonces")
		}
		if bytes.Equal(proto.HandshakeMAC(key, "sandboxd init", hostNonce1, initNonce), proto.HandshakeMAC(key, "sandboxd host", hostNonce1, initNonce)) {
			t.Error("got the same proof for both directions")
		}
	})
}

func TestTakeChannelKey(t *testing.T) {
	dir := t.TempDir()
	key := proto.NewChannelKey()
	p := filepath.Join(dir, "channel.key")
	if err := os.WriteFile(p, []byte(proto.EncodeChannelKey(key)+"\n"), 0o400); err != nil {
		t.Fatal(err)
	}
	got, err := TakeChannelKey(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, key) {
		t.Errorf("got key %x, want %x", got, key)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("got %v for the key file after taking it, want it deleted", err)
	}
	for _, bad := range []string{"", "zz", proto.EncodeChannelKey(key[:16])} {
		if _, err := proto.ParseChannelKey(bad); err == nil {
			t.Errorf("ParseChannelKey(%q): got nil error, want one", bad)
		}
	}
}
