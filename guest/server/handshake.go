package server

import (
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"

	"sandboxd/guest/proto"
)

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
