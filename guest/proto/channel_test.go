package proto

import (
	"bytes"
	"testing"
)

func TestHandshakeMAC(t *testing.T) {
	key := NewChannelKey()
	t.Run("ProofIsNotReplayable", func(t *testing.T) {
		// The init's proof covers the host's fresh nonce: a recording of one attach does not
		// answer the next one.
		hostNonce1 := bytes.Repeat([]byte{1}, NonceLen)
		hostNonce2 := bytes.Repeat([]byte{2}, NonceLen)
		initNonce := bytes.Repeat([]byte{3}, NonceLen)
		if bytes.Equal(HandshakeMAC(key, "sandboxd init", hostNonce1, initNonce), HandshakeMAC(key, "sandboxd init", hostNonce2, initNonce)) {
			t.Error("got the same proof for two host nonces")
		}
		if bytes.Equal(HandshakeMAC(key, "sandboxd init", hostNonce1, initNonce), HandshakeMAC(key, "sandboxd host", hostNonce1, initNonce)) {
			t.Error("got the same proof for both directions")
		}
	})
}
