package client_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
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
		err := server.InitHandshake(i, initKey)
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
	t.Run("GreetingBeforeReady", func(t *testing.T) {
		// A runtime whose stream buffers (an attach program's stdin) greets before the ready
		// byte arrives; the init, once up, sends the ready byte and finds the greeting waiting.
		h, i := net.Pipe()
		defer h.Close()
		defer i.Close()
		_ = h.SetDeadline(time.Now().Add(5 * time.Second))
		_ = i.SetDeadline(time.Now().Add(5 * time.Second))
		greeted := make(chan client.Hello, 1)
		go func() {
			hello, err := client.HostHello(h)
			if err != nil {
				t.Error(err)
			}
			greeted <- hello
		}()
		initErr := make(chan error, 1)
		go func() {
			// The greeting is read before the ready byte is written: net.Pipe does not
			// buffer, so this is the order a buffering stream delivers.
			hello := make([]byte, len(proto.HandshakeHostHello)+proto.NonceLen)
			if _, err := io.ReadFull(i, hello); err != nil {
				initErr <- err
				return
			}
			if _, err := i.Write([]byte{proto.ConnectReady}); err != nil {
				initErr <- err
				return
			}
			initErr <- server.InitHandshake(struct {
				io.Reader
				io.Writer
			}{io.MultiReader(bytes.NewReader(hello), i), i}, key)
		}()
		hello := <-greeted
		if err := client.AwaitReady(h); err != nil {
			t.Fatal(err)
		}
		if err := hello.Finish(h, key); err != nil {
			t.Errorf("Finish after an early greeting: %v", err)
		}
		if err := <-initErr; err != nil {
			t.Errorf("init: %v", err)
		}
		if err := (client.Hello{}).Finish(h, key); err == nil {
			t.Error("Finish without a greeting: got nil, want an error")
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
}
