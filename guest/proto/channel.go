package proto

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
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
	// ChannelKeyAwaitEnv set to 1 makes PID 1 wait for its ChannelKeyFileEnv file instead of
	// refusing to start without it: a Kubernetes pod whose image carries the init has no init
	// container to write the key, so the runtime's first attach brings it (ConnectProvision).
	// Nothing else runs in the box until PID 1 listens, which it does only with the key.
	ChannelKeyAwaitEnv = "SBX_CHANNEL_KEY_AWAIT"
	// ConnectProvision is `connect`'s argument (then the key file's path) with which the runtime's
	// first attach of such a pod sends the key as the first line of the stream's stdin (hex,
	// then "\n"). connect writes it to the file only while PID 1 is not listening yet, that is
	// before anything of the workload can have run, and removes whatever is left of the file once
	// PID 1 answers. The runtime provisions only the pod it just made and never again, so a
	// `connect` the workload replaced later is never sent the key.
	ConnectProvision = "provision"
	// ConnectProgramError begins every error the connect program (guest/connect/connect.c, the
	// C twin of `sandbox-init connect`) writes to its stderr: the runtime tells by it that the
	// program ran, and falls back to the init's connect only when it did not (an image made
	// before it existed).
	ConnectProgramError = "sandbox-connect: "
	// RequireContainmentEnv set to 1 makes PID 1 refuse to serve unless it could set up all of
	// its containment: hide its host socket's folder (when it has one), track execs in
	// cgroups, refuse mounts and drop CAP_SYS_ADMIN. The local runtime, which starts it with
	// that capability, sets it, so a box never runs with less than the runtime promised.
	RequireContainmentEnv = "SBX_REQUIRE_CONTAINMENT"
	// StopSignalsEnv set to 0 makes PID 1 ignore SIGTERM and SIGINT, from anyone: a runtime
	// that never asks the init to stop with them (the local runtime ends a box with SIGKILL)
	// sets it, so that a command in the box cannot end its init with `kill 1`. Unset, they
	// stop it gracefully, as a Kubernetes pod's deletion asks.
	StopSignalsEnv = "SBX_STOP_SIGNALS"
	// SpawnerEnv is the path in the box of the spawner program (guest/spawner), which PID 1
	// then starts the commands with; a runtime that installs one sets it.
	SpawnerEnv = "SBX_SPAWNER"
	// ChannelKeyLen is the key's length in bytes.
	ChannelKeyLen = 32

	// NonceLen is the length of each side's nonce, MACLen of each side's proof.
	NonceLen = 32
	MACLen   = sha256.Size
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

// The labels of the two proofs: each side's HMAC covers its label, then both nonces.
const (
	InitProofLabel = "sandboxd init"
	HostProofLabel = "sandboxd host"
)

// HandshakeMAC is one side's proof: HMAC-SHA256(key, label ‖ host nonce ‖ init nonce).
func HandshakeMAC(key []byte, label string, hostNonce, initNonce []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	m.Write(hostNonce)
	m.Write(initNonce)
	return m.Sum(nil)
}
