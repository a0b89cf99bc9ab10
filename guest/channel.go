package guest

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// The channel handshake. Every attach stream (the host socket, `init connect`, a Kubernetes
// exec of it) reaches PID 1 through something a workload might have replaced: a socket path,
// a relay process. So before any protocol byte both ends prove that they hold the box's channel
// key, a random secret the runtime makes for each start of a box's compute and hands to PID 1
// in a file that PID 1 reads and deletes before any workload runs (ChannelKeyFileEnv). PID 1
// keeps it in memory only and is not dumpable, so a command in the box cannot read it back
// (/proc/1/environ, /proc/1/mem and /proc/1/fd are denied). An impostor — a program of the
// workload listening where the runtime dials, or another box's init reached through a planted
// link — cannot answer the challenge, and the runtime reports the box as tampered with.
//
// After the ready byte:
//
//	host → init   HandshakeHostHello (5 bytes) + host nonce (32)
//	init → host   HandshakeInitHello (5 bytes) + init nonce (32) + HMAC-SHA256(key, "sandboxd init" ‖ host nonce ‖ init nonce)
//	host → init   HMAC-SHA256(key, "sandboxd host" ‖ host nonce ‖ init nonce)
//	init → host   HandshakeOK (1 byte)
//
// and then HTTP/2. Neither side sends its proof before it has seen the other's nonce, so a
// proof can never be replayed to a later attach. The stream is not encrypted: it is the
// runtime's own stream into one box (a pipe, a unix socket, the API server's exec), and a
// workload that relays it can only relay its own box's calls.
const (
	// ChannelKeyFileEnv names the file PID 1 reads its channel key from (hex, ChannelKeyLen
	// bytes) and deletes at start. Without it the init serves no handshake (tests on a host).
	ChannelKeyFileEnv = "SBX_CHANNEL_KEY_FILE"
	// ChannelKeyEnv carries the key to `sandbox-init install` (a Kubernetes init container),
	// which writes it to the ChannelKeyFileEnv file of the sandbox container's shared folder.
	ChannelKeyEnv = "SBX_CHANNEL_KEY"
	// RequireContainmentEnv set to 1 makes PID 1 refuse to serve unless it could set up all of
	// its containment: hide its host socket's folder (when it has one), track execs in
	// cgroups, refuse mounts and drop CAP_SYS_ADMIN. The local runtime, which starts it with
	// that capability, sets it, so a box never runs with less than the runtime promised.
	RequireContainmentEnv = "SBX_REQUIRE_CONTAINMENT"
	// ChannelKeyLen is the key's length in bytes.
	ChannelKeyLen = 32

	nonceLen = 32
	macLen   = sha256.Size
)

// Handshake messages.
var (
	HandshakeHostHello = []byte("SBXH1")
	HandshakeInitHello = []byte("SBXI1")
)

// HandshakeOK is the init's last handshake byte: it accepted the host's proof.
const HandshakeOK byte = 0x01

// ErrImpostor means the other end of an attach stream is not the box's own guest init (it
// answered the handshake wrongly): the stream was redirected or something in the box
// impersonates the init. Drivers report such a box as failed.
var ErrImpostor = errors.New("guest: the attach stream's peer is not this box's guest init")

// ErrHostUnproven is the init's side of ErrImpostor: the caller could not prove the key.
var ErrHostUnproven = errors.New("guest: the caller did not prove the channel key")

// NewChannelKey returns a fresh random channel key.
func NewChannelKey() []byte {
	k := make([]byte, ChannelKeyLen)
	if _, err := rand.Read(k); err != nil {
		panic("guest: no randomness for a channel key: " + err.Error())
	}
	return k
}

// EncodeChannelKey is the key as stored in files and environment variables (hex).
func EncodeChannelKey(k []byte) string { return hex.EncodeToString(k) }

// ParseChannelKey parses an encoded key.
func ParseChannelKey(s string) ([]byte, error) {
	k, err := hex.DecodeString(strings.TrimSpace(s))
	if err != nil || len(k) != ChannelKeyLen {
		return nil, fmt.Errorf("guest: a channel key is %d hex-encoded bytes", ChannelKeyLen)
	}
	return k, nil
}

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
	return ParseChannelKey(string(b))
}

func channelMAC(key []byte, label string, hostNonce, initNonce []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	m.Write(hostNonce)
	m.Write(initNonce)
	return m.Sum(nil)
}

// HostHandshake is the runtime's side of the handshake on a new attach stream (after its ready
// byte). An answer that is not the box's init's (a wrong greeting or proof, or a refusal of
// our proof) is ErrImpostor; a stream that breaks or times out is an ordinary error. The
// caller bounds it with a deadline.
func HostHandshake(rw io.ReadWriter, key []byte) error {
	if len(key) != ChannelKeyLen {
		return fmt.Errorf("guest: host handshake: no channel key for this box")
	}
	hostNonce := make([]byte, nonceLen)
	_, _ = rand.Read(hostNonce)
	if _, err := rw.Write(append(append([]byte{}, HandshakeHostHello...), hostNonce...)); err != nil {
		return fmt.Errorf("guest: host handshake: %w", err)
	}
	msg := make([]byte, len(HandshakeInitHello)+nonceLen+macLen)
	if _, err := io.ReadFull(rw, msg[:len(HandshakeInitHello)]); err != nil {
		return fmt.Errorf("guest: host handshake: %w", err)
	}
	if string(msg[:len(HandshakeInitHello)]) != string(HandshakeInitHello) {
		return fmt.Errorf("%w: it greeted with %q", ErrImpostor, msg[:len(HandshakeInitHello)])
	}
	if _, err := io.ReadFull(rw, msg[len(HandshakeInitHello):]); err != nil {
		return fmt.Errorf("guest: host handshake: %w", err)
	}
	initNonce := msg[len(HandshakeInitHello) : len(HandshakeInitHello)+nonceLen]
	proof := msg[len(HandshakeInitHello)+nonceLen:]
	if !hmac.Equal(proof, channelMAC(key, "sandboxd init", hostNonce, initNonce)) {
		return fmt.Errorf("%w: it does not hold the box's channel key", ErrImpostor)
	}
	if _, err := rw.Write(channelMAC(key, "sandboxd host", hostNonce, initNonce)); err != nil {
		return fmt.Errorf("guest: host handshake: %w", err)
	}
	var ok [1]byte
	if _, err := io.ReadFull(rw, ok[:]); err != nil {
		return fmt.Errorf("guest: host handshake: waiting for the init's acceptance: %w", err)
	}
	if ok[0] != HandshakeOK {
		return fmt.Errorf("%w: it refused our proof", ErrImpostor)
	}
	return nil
}

// InitHandshake is PID 1's side: it proves the key and checks the caller's proof
// (ErrHostUnproven when it is wrong). The caller bounds it with a deadline and closes the
// connection on any error.
func InitHandshake(rw io.ReadWriter, key []byte) error {
	hello := make([]byte, len(HandshakeHostHello)+nonceLen)
	if _, err := io.ReadFull(rw, hello[:len(HandshakeHostHello)]); err != nil {
		return fmt.Errorf("guest: init handshake: %w", err)
	}
	if string(hello[:len(HandshakeHostHello)]) != string(HandshakeHostHello) {
		return fmt.Errorf("%w: it greeted with %q", ErrHostUnproven, hello[:len(HandshakeHostHello)])
	}
	if _, err := io.ReadFull(rw, hello[len(HandshakeHostHello):]); err != nil {
		return fmt.Errorf("guest: init handshake: %w", err)
	}
	hostNonce := hello[len(HandshakeHostHello):]
	initNonce := make([]byte, nonceLen)
	_, _ = rand.Read(initNonce)
	msg := append(append(append([]byte{}, HandshakeInitHello...), initNonce...), channelMAC(key, "sandboxd init", hostNonce, initNonce)...)
	if _, err := rw.Write(msg); err != nil {
		return fmt.Errorf("guest: init handshake: %w", err)
	}
	proof := make([]byte, macLen)
	if _, err := io.ReadFull(rw, proof); err != nil {
		return fmt.Errorf("guest: init handshake: %w", err)
	}
	if !hmac.Equal(proof, channelMAC(key, "sandboxd host", hostNonce, initNonce)) {
		return ErrHostUnproven
	}
	if _, err := rw.Write([]byte{HandshakeOK}); err != nil {
		return fmt.Errorf("guest: init handshake: %w", err)
	}
	return nil
}
