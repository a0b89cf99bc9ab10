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

	"sandboxd/guest/proto"
)

func TestInitHandshake(t *testing.T) {
	key := proto.NewChannelKey()
	other := proto.NewChannelKey()
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
