package client

import (
	"crypto/hmac"
	"crypto/rand"
	"fmt"
	"io"

	"sandboxd/guest/proto"
)

// AwaitReady reads the ConnectReady byte from a new attach stream.
func AwaitReady(r io.Reader) error {
	var b [1]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return fmt.Errorf("guest: waiting for the init's ready byte: %w", err)
	}
	if b[0] != proto.ConnectReady {
		return fmt.Errorf("%w: the stream began with %#x, not the ready byte %#x", proto.ErrImpostor, b[0], proto.ConnectReady)
	}
	return nil
}

// HostHandshake is the runtime's side of the handshake on a new attach stream (after its ready
// byte). An answer that is not the box's init's (a wrong greeting or proof, or a refusal of
// our proof) is ErrImpostor; a stream that breaks or times out is an ordinary error. The
// caller bounds it with a deadline.
func HostHandshake(rw io.ReadWriter, key []byte) error {
	if len(key) != proto.ChannelKeyLen {
		return fmt.Errorf("guest: host handshake: no channel key for this box")
	}
	hello, err := HostHello(rw)
	if err != nil {
		return err
	}
	return hello.Finish(rw, key)
}

// Hello is the host's greeting, sent: the first half of HostHandshake.
type Hello struct{ nonce []byte }

// HostHello sends the host's greeting. A runtime whose stream delivers it only once the init
// dialled (an attach program's stdin) may send it before the ready byte arrived, and so save
// a round trip; Finish then completes the handshake after AwaitReady.
func HostHello(w io.Writer) (Hello, error) {
	hostNonce := make([]byte, proto.NonceLen)
	_, _ = rand.Read(hostNonce)
	if _, err := w.Write(append(append([]byte{}, proto.HandshakeHostHello...), hostNonce...)); err != nil {
		return Hello{}, fmt.Errorf("guest: host handshake: %w", err)
	}
	return Hello{nonce: hostNonce}, nil
}

// Finish is the rest of HostHandshake after HostHello.
func (h Hello) Finish(rw io.ReadWriter, key []byte) error {
	if len(key) != proto.ChannelKeyLen {
		return fmt.Errorf("guest: host handshake: no channel key for this box")
	}
	if len(h.nonce) != proto.NonceLen {
		return fmt.Errorf("guest: host handshake: no greeting was sent")
	}
	hostNonce := h.nonce
	msg := make([]byte, len(proto.HandshakeInitHello)+proto.NonceLen+proto.MACLen)
	if _, err := io.ReadFull(rw, msg[:len(proto.HandshakeInitHello)]); err != nil {
		return fmt.Errorf("guest: host handshake: %w", err)
	}
	if string(msg[:len(proto.HandshakeInitHello)]) != string(proto.HandshakeInitHello) {
		return fmt.Errorf("%w: it greeted with %q", proto.ErrImpostor, msg[:len(proto.HandshakeInitHello)])
	}
	if _, err := io.ReadFull(rw, msg[len(proto.HandshakeInitHello):]); err != nil {
		return fmt.Errorf("guest: host handshake: %w", err)
	}
	initNonce := msg[len(proto.HandshakeInitHello) : len(proto.HandshakeInitHello)+proto.NonceLen]
	proof := msg[len(proto.HandshakeInitHello)+proto.NonceLen:]
	if !hmac.Equal(proof, proto.HandshakeMAC(key, proto.InitProofLabel, hostNonce, initNonce)) {
		return fmt.Errorf("%w: it does not hold the box's channel key", proto.ErrImpostor)
	}
	if _, err := rw.Write(proto.HandshakeMAC(key, proto.HostProofLabel, hostNonce, initNonce)); err != nil {
		return fmt.Errorf("guest: host handshake: %w", err)
	}
	var ok [1]byte
	if _, err := io.ReadFull(rw, ok[:]); err != nil {
		return fmt.Errorf("guest: host handshake: waiting for the init's acceptance: %w", err)
	}
	if ok[0] != proto.HandshakeOK {
		return fmt.Errorf("%w: it refused our proof", proto.ErrImpostor)
	}
	return nil
}
