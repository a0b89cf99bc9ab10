package server

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sandboxd/guest/proto"
)

// TestWatchQueueOverflow: when the kernel's inotify queue overflows (IN_Q_OVERFLOW), the
// watch reports it in order as an EventOverflow (ReasonQueue), never as a silent gap.
func TestWatchQueueOverflow(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/fs/inotify/max_queued_events")
	if err != nil {
		t.Skipf("no inotify queue bound to overflow: %v", err)
	}
	var queue int
	fmt.Sscan(string(b), &queue)
	ws := t.TempDir()
	s, err := New(Options{Workspace: ws, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start := make(chan *watch, 1)
	startWatchLoop = func(w *watch) { start <- w }
	defer func() { startWatchLoop = func(w *watch) { go w.loop() } }()
	w, _, perr := s.watches.create(proto.WatchRequest{Path: ".", MaxEvents: proto.MaxWatchEvents})
	if perr != nil {
		t.Fatal(perr)
	}
	<-start
	// More events than the queue holds while nothing reads it.
	for i := range queue/2 + 100 {
		p := filepath.Join(ws, fmt.Sprintf("f%d", i))
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	go w.loop()
	deadline := time.Now().Add(20 * time.Second)
	var after uint64
	for time.Now().Before(deadline) {
		evs, _, notify := w.read(after, 1024)
		for _, ev := range evs {
			if ev.Kind == proto.EventOverflow && ev.Reason == proto.ReasonQueue {
				if ev.Seq != after+1 && after != 0 {
					t.Errorf("overflow at seq %d after %d: events skipped", ev.Seq, after)
				}
				return
			}
			after = ev.Seq
		}
		if len(evs) > 0 {
			continue
		}
		select {
		case <-notify:
		case <-time.After(time.Second):
		}
	}
	t.Fatalf("no queue overflow event after %d events", after)
}
