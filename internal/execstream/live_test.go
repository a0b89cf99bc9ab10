package execstream

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"sandboxd/internal/redistest"
)

// fromMemory reports whether a chunk event's data is the appended chunk's own bytes (the live
// window), not a copy read back from Redis.
func fromMemory(ev Event, c Chunk) bool {
	return len(ev.Data) > 0 && len(c.Data) > 0 && &ev.Data[0] == &c.Data[0]
}

// sameEvents fails unless a and b are the same events (kinds, cursors, streams, bytes, exits).
func sameEvents(t *testing.T, a, b []Event) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("got %d events and %d events, want the same", len(a), len(b))
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Kind != y.Kind || x.Cursor != y.Cursor || x.Stream != y.Stream || !bytes.Equal(x.Data, y.Data) || x.Missed != y.Missed ||
			(x.Exit == nil) != (y.Exit == nil) || x.Exit != nil && *x.Exit != *y.Exit ||
			(x.End == nil) != (y.End == nil) || x.End != nil && *x.End != *y.End {
			t.Fatalf("event %d: got %+v and %+v, want the same", i, x, y)
		}
	}
}

func TestLiveFeedMatchesRedis(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		follower, c := newStore(srv, Options{})
		other := New(srv.Client, Options{Now: c.Now, Block: 100 * time.Millisecond}) // another replica
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		create(t, follower, c, "exec_live")
		// Some output before anyone subscribes: replayed from Redis.
		want := series(0, numbered(0, 600)...)
		mustAppend(t, follower, "exec_live", "A", want[:100], nil)
		local, err := follower.Subscribe(ctx, "exec_live", "")
		if err != nil {
			t.Fatal(err)
		}
		remote, err := other.Subscribe(ctx, "exec_live", "")
		if err != nil {
			t.Fatal(err)
		}
		// The rest in batches, with a hole (output the guest dropped) in the middle.
		mustAppend(t, follower, "exec_live", "A", want[100:300], nil)
		hole := Chunk{Stream: Gap, Start: want[300].Start, Offset: want[310].Start}
		mustAppend(t, follower, "exec_live", "A", []Chunk{hole}, nil)
		for i := 310; i < len(want); i += 50 {
			time.Sleep(time.Millisecond)
			mustAppend(t, follower, "exec_live", "A", want[i:min(i+50, len(want))], nil)
		}
		mustAppend(t, follower, "exec_live", "A", nil, &Exit{ExitCode: 3, StdoutBytes: 7})
		got := collect(t, local, 30*time.Second)
		sameEvents(t, got, collect(t, remote, 30*time.Second))
		sameEvents(t, got, readAll(t, other, "exec_live", "", 1000))
		// What came after the subscriber caught up came from memory.
		live := 0
		for _, ev := range got {
			if ev.Kind != EventChunk {
				continue
			}
			for _, w := range want[100:] {
				if ev.Cursor == fmt.Sprintf("%d-0", w.Offset) && fromMemory(ev, w) {
					live++
				}
			}
		}
		if live == 0 {
			t.Fatalf("no event of the %d after the subscription came from the live window", len(want)-110)
		}
		t.Logf("%d of %d chunk events from the live window", live, len(got)-2)
	})
}

func TestLiveFeedResumeFromACursor(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		create(t, s, c, "exec_resume")
		want := series(0, numbered(0, 40)...)
		first, err := s.Subscribe(ctx, "exec_resume", "")
		if err != nil {
			t.Fatal(err)
		}
		mustAppend(t, s, "exec_resume", "A", want[:20], nil)
		evs := collectN(t, first, 20)
		// A second subscriber resumes from the middle while the window holds it.
		mid := evs[9].Cursor
		second, err := s.Subscribe(ctx, "exec_resume", mid)
		if err != nil {
			t.Fatal(err)
		}
		mustAppend(t, s, "exec_resume", "A", want[20:], &Exit{})
		rest := collect(t, second, 10*time.Second)
		sameEvents(t, rest, readAll(t, s, "exec_resume", mid, 100))
		sameEvents(t, append(evs, collect(t, first, 10*time.Second)...), readAll(t, s, "exec_resume", "", 100))
	})
}

// collectN reads exactly n events.
func collectN(t *testing.T, ch <-chan Event, n int) []Event {
	t.Helper()
	var out []Event
	for len(out) < n {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("closed after %d events, want %d", len(out), n)
			}
			out = append(out, ev)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d events after 10s, want %d", len(out), n)
		}
	}
	return out
}

func TestLiveFeedFollowerMovesAway(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		a, c := newStore(srv, Options{})
		b := New(srv.Client, Options{Now: c.Now, Block: 100 * time.Millisecond})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		create(t, a, c, "exec_move")
		want := series(0, numbered(0, 30)...)
		sub, err := a.Subscribe(ctx, "exec_move", "")
		if err != nil {
			t.Fatal(err)
		}
		mustAppend(t, a, "exec_move", "A", want[:10], nil)
		got := collectN(t, sub, 10)
		// A's follower stalls without saying so; B takes the lease over and goes on: the
		// subscriber on A notices after a quiet window and reads Redis.
		c.Add(lease)
		if _, ok, err := b.TryFollow(ctx, "exec_move", "B", c.Now(), lease); err != nil || !ok {
			t.Fatalf("B takes over: ok=%v err=%v", ok, err)
		}
		mustAppend(t, b, "exec_move", "B", want[10:20], nil)
		got = append(got, collectN(t, sub, 10)...)
		// Then A follows again (its own window begins anew there), and says when it stops.
		c.Add(lease)
		if _, ok, err := a.TryFollow(ctx, "exec_move", "A", c.Now(), lease); err != nil || !ok {
			t.Fatalf("A takes over: ok=%v err=%v", ok, err)
		}
		mustAppend(t, a, "exec_move", "A", want[20:25], nil)
		got = append(got, collectN(t, sub, 5)...)
		a.EndFeed("exec_move")
		c.Add(lease)
		if _, ok, err := b.TryFollow(ctx, "exec_move", "B", c.Now(), lease); err != nil || !ok {
			t.Fatalf("B takes over again: ok=%v err=%v", ok, err)
		}
		mustAppend(t, b, "exec_move", "B", want[25:], &Exit{ExitCode: 2})
		got = append(got, collect(t, sub, 10*time.Second)...)
		sameEvents(t, got, readAll(t, b, "exec_move", "", 100))
		checkChunks(t, got[:len(got)-1], want)
	})
}

func TestLiveFeedIsBounded(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{Buffer: 2, MaxBytes: 64 << 20})
		ctx, cancel := context.WithCancel(context.Background())
		create(t, s, c, "exec_bound")
		// A subscriber that never reads, and one that reads everything at the end.
		if _, err := s.Subscribe(ctx, "exec_bound", ""); err != nil {
			t.Fatal(err)
		}
		late, err := s.Subscribe(ctx, "exec_bound", "")
		if err != nil {
			t.Fatal(err)
		}
		data := bytes.Repeat([]byte("z"), 64<<10)
		var start int64
		var want []Chunk
		for range 160 { // 10 MiB, more than the window keeps
			ch := chunk(Stdout, start, data)
			mustAppend(t, s, "exec_bound", "A", []Chunk{ch}, nil)
			want = append(want, ch)
			start = ch.Offset
			s.live.mu.Lock()
			held, total := int64(0), s.live.total
			for _, f := range s.live.execs {
				held += f.bytes
			}
			s.live.mu.Unlock()
			if held != total || total > liveExecBytes {
				t.Fatalf("the windows hold %d bytes (counted %d), want at most %d", held, total, liveExecBytes)
			}
		}
		mustAppend(t, s, "exec_bound", "A", nil, &Exit{})
		// The late reader went back to Redis for what the window had dropped: nothing lost.
		got := collect(t, late, 30*time.Second)
		if len(got) != len(want)+1 || got[len(got)-1].Kind != EventExit {
			t.Fatalf("late reader: got %d events, want %d chunks and the exit", len(got), len(want))
		}
		checkChunks(t, got[:len(want)], want)
		// Once every subscriber is gone, nothing is kept.
		cancel()
		deadline := time.Now().Add(10 * time.Second)
		for {
			s.live.mu.Lock()
			n, total := len(s.live.execs), s.live.total
			s.live.mu.Unlock()
			if n == 0 && total == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d windows holding %d bytes after every subscriber ended", n, total)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

func TestLiveWindowNeverOutlivesTheStream(t *testing.T) {
	// The window keeps no more entries than the stream: a subscriber that lags past the
	// stream's bound gets the truncated event it would get from Redis.
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{MaxLen: 5})
		if s.live.maxLen != 5 || s.live.maxBytes != liveExecBytes {
			t.Fatalf("window bounds: got %d entries, %d bytes; want 5, %d", s.live.maxLen, s.live.maxBytes, liveExecBytes)
		}
		small := New(srv.Client, Options{MaxBytes: 64 << 10})
		if small.live.maxBytes != 64<<10 {
			t.Fatalf("window bound: got %d bytes, want %d", small.live.maxBytes, 64<<10)
		}
		create(t, s, c, "exec_len")
		f := s.live.watch("exec_len")
		defer f.unwatch()
		mustAppend(t, s, "exec_len", "A", series(0, numbered(0, 12)...), nil)
		s.live.mu.Lock()
		n := len(f.entries)
		s.live.mu.Unlock()
		if n != 5 {
			t.Fatalf("window: got %d entries, want 5", n)
		}
	})
}
