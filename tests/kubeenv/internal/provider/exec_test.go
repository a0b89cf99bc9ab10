package provider

import (
	"bytes"
	"context"
	"os"
	"sync"
	"testing"
	"time"
)

// slowDst takes delay per write and counts what it got.
type slowDst struct {
	mu    sync.Mutex
	n     int
	delay time.Duration
	block chan struct{} // when not nil, every write waits for it to close
}

func (d *slowDst) Write(p []byte) (int, error) {
	if d.block != nil {
		<-d.block
	}
	time.Sleep(d.delay)
	d.mu.Lock()
	d.n += len(p)
	d.mu.Unlock()
	return len(p), nil
}

func (d *slowDst) got() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n
}

// command stands for an exec'd command's output: it writes size bytes to the pipe and
// returns once they are all in (the command exits); w stays open (a background process of
// the command holds it) unless closeAtExit.
func command(t *testing.T, size int, closeAtExit bool) (*os.File, <-chan struct{}) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_, _ = w.Write(bytes.Repeat([]byte{'x'}, size))
		if closeAtExit {
			w.Close()
		}
	}()
	return r, exited
}

// TestDrainSlowClient: when the command exits, output still in the pipe and in a copy blocked
// on a slow client is copied to its end, though that takes far longer than the idle bound (an
// exec that ended a fixed time after the exit cut a slow reader's stream short).
func TestDrainSlowClient(t *testing.T) {
	const size, idle = 256 << 10, 50 * time.Millisecond
	r, exited := command(t, size, false)
	dst := &slowDst{delay: 4 * idle} // 8 writes of 32 KiB: 1.6 s
	var p outputPump
	p.start(dst, r)
	<-exited
	p.drain(context.Background(), idle)
	if got := dst.got(); got != size {
		t.Fatalf("the client got %d of %d bytes when the drain ended", got, size)
	}
}

// TestDrainIdleHolder: an output held open by a background process that writes nothing ends
// the drain after the idle bound, not at its EOF.
func TestDrainIdleHolder(t *testing.T) {
	const idle = 100 * time.Millisecond
	r, exited := command(t, 10, false)
	dst := &slowDst{}
	var p outputPump
	p.start(dst, r)
	<-exited
	start := time.Now()
	done := make(chan struct{})
	go func() { p.drain(context.Background(), idle); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the drain of an output held open without writes did not end")
	}
	if d := time.Since(start); d < idle {
		t.Fatalf("the drain ended after %s, before the idle bound %s", d, idle)
	}
	if got := dst.got(); got != 10 {
		t.Fatalf("the client got %d of 10 bytes", got)
	}
}

// TestDrainEOF: outputs closed with the command end the drain at their EOF, with all of it.
func TestDrainEOF(t *testing.T) {
	r1, exited1 := command(t, 100<<10, true)
	r2, exited2 := command(t, 3, true)
	dst1, dst2 := &slowDst{}, &slowDst{}
	var p outputPump
	p.start(dst1, r1)
	p.start(dst2, r2)
	<-exited1
	<-exited2
	p.drain(context.Background(), time.Hour)
	if dst1.got() != 100<<10 || dst2.got() != 3 {
		t.Fatalf("got %d and %d bytes, want %d and 3", dst1.got(), dst2.got(), 100<<10)
	}
}

// TestDrainClientGone: a client gone is not waited for, even with a write to it blocked.
func TestDrainClientGone(t *testing.T) {
	r, exited := command(t, 10, false)
	dst := &slowDst{block: make(chan struct{})}
	defer close(dst.block)
	var p outputPump
	p.start(dst, r)
	<-exited
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan struct{})
	go func() { p.drain(ctx, time.Hour); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the drain waited on a write to a client that is gone")
	}
}
