package guest

import (
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"

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

// ErrHostUnproven is the init's side of ErrImpostor: the caller could not prove the key.
var ErrHostUnproven = errors.New("guest: the caller did not prove the channel key")

// TakeChannelKey reads the key file at path and deletes it, so that nothing started later in
// the box finds it.
func TakeChannelKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("guest: channel key: %w", err)
	}
	if err := os.Remove(path); err != nil {
		return nil, fmt.Errorf("guest: channel key: removing %s: %w", path, err)
	}
	return proto.ParseChannelKey(string(b))
}

// HostHandshake is the runtime's side of the handshake on a new attach stream (after its ready
// byte). An answer that is not the box's init's (a wrong greeting or proof, or a refusal of
// our proof) is ErrImpostor; a stream that breaks or times out is an ordinary error. The
// caller bounds it with a deadline.
func HostHandshake(rw io.ReadWriter, key []byte) error {
	if len(key) != proto.ChannelKeyLen {
		return fmt.Errorf("guest: host handshake: no channel key for this box")
	}
	hostNonce := make([]byte, proto.NonceLen)
	_, _ = rand.Read(hostNonce)
	if _, err := rw.Write(append(append([]byte{}, proto.HandshakeHostHello...), hostNonce...)); err != nil {
		return fmt.Errorf("guest: host handshake: %w", err)
	}
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

// InitHandshake is PID 1's side: it proves the key and checks the caller's proof
// (ErrHostUnproven when it is wrong). The caller bounds it with a deadline and closes the
// connection on any error.
func InitHandshake(rw io.ReadWriter, key []byte) error {
	hello := make([]byte, len(proto.HandshakeHostHello)+proto.NonceLen)
	if _, err := io.ReadFull(rw, hello[:len(proto.HandshakeHostHello)]); err != nil {
		return fmt.Errorf("guest: init handshake: %w", err)
	}
	if string(hello[:len(proto.HandshakeHostHello)]) != string(proto.HandshakeHostHello) {
		return fmt.Errorf("%w: it greeted with %q", ErrHostUnproven, hello[:len(proto.HandshakeHostHello)])
	}
	if _, err := io.ReadFull(rw, hello[len(proto.HandshakeHostHello):]); err != nil {
		return fmt.Errorf("guest: init handshake: %w", err)
	}
	hostNonce := hello[len(proto.HandshakeHostHello):]
	initNonce := make([]byte, proto.NonceLen)
	_, _ = rand.Read(initNonce)
	msg := append(append(append([]byte{}, proto.HandshakeInitHello...), initNonce...), proto.HandshakeMAC(key, proto.InitProofLabel, hostNonce, initNonce)...)
	if _, err := rw.Write(msg); err != nil {
		return fmt.Errorf("guest: init handshake: %w", err)
	}
	proof := make([]byte, proto.MACLen)
	if _, err := io.ReadFull(rw, proof); err != nil {
		return fmt.Errorf("guest: init handshake: %w", err)
	}
	if !hmac.Equal(proof, proto.HandshakeMAC(key, proto.HostProofLabel, hostNonce, initNonce)) {
		return ErrHostUnproven
	}
	if _, err := rw.Write([]byte{proto.HandshakeOK}); err != nil {
		return fmt.Errorf("guest: init handshake: %w", err)
	}
	return nil
}
