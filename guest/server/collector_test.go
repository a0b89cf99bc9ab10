package server

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/guest/proto"
)

// The collector's latency rules, checked without timing anything: its linger is set to an
// hour, so output that waited for a linger would not reach the log within the test's deadline.

// startCollector runs a collector with an hour's linger on one new output pipe and returns the
// pipe's write end, the log, and a channel closed when the collector returns.
func startCollector(t *testing.T) (*os.File, *execLog, <-chan struct{}) {
	t.Helper()
	_, w, l, done := runCollector(t, func(c *collector) { c.linger = time.Hour })
	return w, l, done
}

// runCollector runs a collector, set up by set, on one new output pipe and returns the pipe's
// read end (the collector's), its write end, the log, and a channel closed when the collector
// returns.
func runCollector(t *testing.T, set func(*collector)) (int, *os.File, *execLog, <-chan struct{}) {
	t.Helper()
	l, _ := newTestLog(t, 1<<20)
	r, w, err := outputPipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(r) })
	c := newCollector(l, []int{r}, []byte{proto.RecordStdout})
	set(c)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run()
	}()
	t.Cleanup(func() {
		_ = w.Close()
		c.stopAt.Store(1) // ends a collector the test left waiting
		<-done
	})
	return r, w, l, done
}

// waitLog waits until the log holds want as its stdout (failing after 10 s).
func waitLog(t *testing.T, l *execLog, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var got []byte
		for _, r := range readAll(t, l, 0) {
			if r.kind == proto.RecordStdout {
				got = append(got, r.data...)
			}
		}
		if string(got) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("log stdout = %q, want %q (output waited for the linger)", got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestCollectorFirstOutputGoesOutAtOnce(t *testing.T) {
	w, l, _ := startCollector(t)
	if _, err := w.Write([]byte("x\n")); err != nil {
		t.Fatal(err)
	}
	// The pipe stays open and quiet: the first output must not wait for more.
	waitLog(t, l, "x\n")
}

func TestCollectorSeesTheEndAfterFirstOutput(t *testing.T) {
	w, l, done := startCollector(t)
	// A command that writes a line and exits: its output and the pipe's end come together.
	if _, err := w.Write([]byte("x\n")); err != nil {
		t.Fatal(err)
	}
	waitLog(t, l, "x\n")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the collector did not notice the pipe's end within 10 s (it waited for the linger)")
	}
	waitLog(t, l, "x\n")
}

// TestCollectorGrowsBusyPipesOnly: an output pipe keeps its default size while a command
// writes little, and is grown to maxCollect by the first read that brings growAt bytes.
func TestCollectorGrowsBusyPipesOnly(t *testing.T) {
	r, w, l, _ := runCollector(t, func(c *collector) {
		c.grow = true
		c.linger = time.Millisecond // output that flows is read again after a linger
	})
	size := func() int {
		n, err := unix.FcntlInt(uintptr(r), unix.F_GETPIPE_SZ, 0)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	initial := size()
	if initial >= maxCollect {
		t.Skipf("pipes start at %d bytes here", initial)
	}
	if _, err := w.Write([]byte("small\n")); err != nil {
		t.Fatal(err)
	}
	waitLog(t, l, "small\n")
	if got := size(); got != initial {
		t.Fatalf("after a small write the pipe holds %d bytes, want its initial %d", got, initial)
	}
	big := strings.Repeat("y", growAt)
	if _, err := w.Write([]byte(big)); err != nil {
		t.Fatal(err)
	}
	waitLog(t, l, "small\n"+big)
	if got := size(); got != maxCollect {
		t.Fatalf("after a write of %d bytes the pipe holds %d bytes, want %d", growAt, got, maxCollect)
	}
}
