package runtime

import (
	"io"
	"sync/atomic"
	"testing"
)

type fakeRWC struct {
	io.ReadWriter
	closed atomic.Int32
	ended  bool
}

func (f *fakeRWC) Close() error { f.closed.Add(1); return nil }

func TestSpares(t *testing.T) {
	var s Spares
	a, b := &fakeRWC{}, &fakeRWC{}
	if s.Take("x") != nil {
		t.Fatal("an empty Spares handed out an attach")
	}
	s.Keep("x", a)
	s.Keep("x", b) // replaces a, which is closed
	if a.closed.Load() != 1 {
		t.Errorf("the replaced spare was closed %d times, want 1", a.closed.Load())
	}
	if got := s.Take("x"); got != b {
		t.Fatalf("Take: got %v, want the newest spare", got)
	}
	if s.Take("x") != nil {
		t.Errorf("a spare was handed out twice")
	}
	s.Keep("y", a)
	s.Drop("y")
	if a.closed.Load() != 2 || s.Take("y") != nil {
		t.Errorf("Drop: closed %d times, want 2, and nothing left", a.closed.Load())
	}
	ended := &fakeRWC{ended: true}
	s.Ended = func(rwc io.ReadWriteCloser) bool { return rwc.(*fakeRWC).ended }
	s.Keep("z", ended)
	if s.Take("z") != nil || ended.closed.Load() != 1 {
		t.Errorf("an ended spare was handed out (closed %d)", ended.closed.Load())
	}
	c := &fakeRWC{}
	s.Keep("w", c)
	s.CloseAll()
	if c.closed.Load() != 1 || s.Take("w") != nil {
		t.Errorf("CloseAll: closed %d, want 1, and nothing left", c.closed.Load())
	}
}
