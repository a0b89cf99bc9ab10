package execstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// scriptGate holds a client's scripts that touch a tag's keys at Redis's door while it is
// shut: an Append's round trip made as long as a test wants. A held script whose context ends
// fails and never reaches Redis.
type scriptGate struct {
	tag     string
	mu      sync.Mutex
	shut    chan struct{} // nil: open
	entered chan struct{} // one send per held script
}

func newScriptGate(c *redis.Client, tag string) *scriptGate {
	g := &scriptGate{tag: tag, entered: make(chan struct{}, 16)}
	c.AddHook(g)
	return g
}

func (g *scriptGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut == nil {
		g.shut = make(chan struct{})
	}
}

func (g *scriptGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut != nil {
		close(g.shut)
		g.shut = nil
	}
}

// waitEntered waits until a script is held.
func (g *scriptGate) waitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no script reached Redis's door within 10s")
	}
}

func (g *scriptGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *scriptGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); (name == "evalsha" || name == "eval") && redistest.Touches(cmd, g.tag) {
			g.mu.Lock()
			shut := g.shut
			g.mu.Unlock()
			if shut != nil {
				g.entered <- struct{}{}
				select {
				case <-shut:
				case <-ctx.Done():
					cmd.SetErr(ctx.Err())
					return ctx.Err()
				}
			}
		}
		return next(ctx, cmd)
	}
}

func (g *scriptGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// gatedStore is a replica whose scripts on the exec's keys can be held (g), beside plain, another
// replica on the same Redis and clock.
func gatedStore(t *testing.T, srv *redistest.Server, execID string) (gated *Store, g *scriptGate, plain *Store, c *clock) {
	plain, c = newStore(srv, Options{})
	rc := redis.NewClient(srv.Client.Options())
	t.Cleanup(func() { rc.Close() })
	g = newScriptGate(rc, execID)
	t.Cleanup(g.open)
	return New(rc, Options{Now: c.Now, Block: 100 * time.Millisecond}), g, plain, c
}

// hold shuts the gate and starts an Append on its own context, which returns once the script
// is held at Redis's door; the Append's error comes on the channel. cancel ends the Append
// there, as a replica that dies with its batch on the way.
func (g *scriptGate) hold(t *testing.T, ctx context.Context, s *Store, id, token string, chunks []Chunk, exit *Exit) (appended <-chan error, cancel func()) {
	t.Helper()
	g.close()
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Append(actx, id, token, chunks, exit) }()
	g.waitEntered(t)
	return done, cancel
}

// fedSubscriber creates exec id (followed by token "A") through plain, marks it fed by
// follower's replica from its start, and subscribes there from the start.
func fedSubscriber(t *testing.T, ctx context.Context, follower, plain *Store, c *clock, id string) <-chan Event {
	t.Helper()
	create(t, plain, c, id)
	follower.BeginFeed(id, 0)
	t.Cleanup(func() { follower.EndFeed(id) })
	sub, err := follower.Subscribe(ctx, id, "")
	if err != nil {
		t.Fatal(err)
	}
	return sub
}

// TestLiveFeedHasChunksBeforeRedis: the follower's replica hands a batch's chunks to its
// subscribers while Redis takes them (not after), and the exit only once Redis has it; other
// replicas get the same events from Redis.
func TestLiveFeedHasChunksBeforeRedis(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		const id = "exec_early"
		s, gate, other, c := gatedStore(t, srv, id)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		local := fedSubscriber(t, ctx, s, other, c, id)
		remote, err := other.Subscribe(ctx, id, "")
		if err != nil {
			t.Fatal(err)
		}
		want := series(0, []byte("hello\n"), []byte("world\n"))
		appended, _ := gate.hold(t, ctx, s, id, "A", want, nil)
		got := collectN(t, local, 2)
		for i, ev := range got {
			if ev.Kind != EventChunk || !ev.Live || !fromMemory(ev, want[i]) || ev.Cursor != fmt.Sprintf("%d-0", want[i].Offset) {
				t.Fatalf("event %d while Redis had not taken the batch: got %+v, want chunk %d from the window", i, ev, i)
			}
		}
		if evs, err := other.Read(ctx, id, "", 10, 0); err != nil || len(evs) != 0 {
			t.Fatalf("Redis while the batch was held: got %d events, %v; want none", len(evs), err)
		}
		gate.open()
		if err := <-appended; err != nil {
			t.Fatal(err)
		}
		// The exit is no news before the stream holds it.
		appended, _ = gate.hold(t, ctx, s, id, "A", nil, &Exit{ExitCode: 4, StdoutBytes: 12})
		select {
		case ev := <-local:
			t.Fatalf("got %+v while Redis had not taken the exit, want nothing", ev)
		case <-time.After(300 * time.Millisecond):
		}
		gate.open()
		if err := <-appended; err != nil {
			t.Fatal(err)
		}
		got = append(got, collect(t, local, 10*time.Second)...)
		all := readAll(t, other, id, "", 100)
		sameEvents(t, got, all)
		sameEvents(t, collect(t, remote, 10*time.Second), all)
	})
}

// TestLiveFeedCursorAheadOfRedis: a replica hands its subscriber a batch and dies before Redis
// takes it. The subscriber's cursor, past what Redis holds, still resumes on another replica
// (and on the same one, back on Redis) once a new follower copies the same records: every byte
// once. A cursor ahead of an exec that ends short of it is refused.
func TestLiveFeedCursorAheadOfRedis(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		const id = "exec_ahead"
		a, gate, b, c := gatedStore(t, srv, id)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		sub := fedSubscriber(t, ctx, a, b, c, id)
		log := series(0, numbered(0, 30)...) // the guest init's log
		mustAppend(t, a, id, "A", log[:10], nil)
		got := collectN(t, sub, 10)
		// A's next batch reaches its subscriber; then A dies with the batch on its way.
		appended, acancel := gate.hold(t, ctx, a, id, "A", log[10:15], nil)
		got = append(got, collectN(t, sub, 5)...)
		acancel()
		if err := <-appended; err == nil {
			t.Fatal("the dead replica's batch reached Redis")
		}
		a.EndFeed(id)
		ahead := got[14].Cursor
		if m, err := b.Get(ctx, id); err != nil || m.Offset != log[9].Offset {
			t.Fatalf("Redis holds offset %d (%v), want %d: the test needs a cursor past it", m.Offset, err, log[9].Offset)
		}
		// The client resumes on B with the cursor A gave it.
		resumed, err := b.Subscribe(ctx, id, ahead)
		if err != nil {
			t.Fatalf("resuming at %s, past what Redis holds: %v", ahead, err)
		}
		if evs, err := b.Read(ctx, id, ahead, 10, 0); err != nil || len(evs) != 0 {
			t.Fatalf("Read at %s before the takeover: got %d events, %v; want none yet", ahead, len(evs), err)
		}
		// B takes over where Redis stands and copies the same records on.
		c.Add(lease)
		off, ok, err := b.TryFollow(ctx, id, "B", c.Now(), lease)
		if err != nil || !ok || off != log[9].Offset {
			t.Fatalf("B takes over: got %d %v %v, want offset %d", off, ok, err, log[9].Offset)
		}
		mustAppend(t, b, id, "B", log[10:20], nil)
		mustAppend(t, b, id, "B", log[20:], &Exit{ExitCode: 0})
		rest := collect(t, resumed, 10*time.Second)
		if len(rest) != len(log)-15+1 || rest[len(rest)-1].Kind != EventExit {
			t.Fatalf("resumed at %s: got %d events, want the %d chunks after it and the exit", ahead, len(rest), len(log)-15)
		}
		checkChunks(t, rest[:len(rest)-1], log[15:])
		sameEvents(t, append(got, collect(t, sub, 10*time.Second)...), readAll(t, b, id, "", 100))

		// A cursor past the end of an exec that ended short of it (the new follower found the
		// sandbox gone): refused, and subscribers waiting there are let go.
		const short = id + "_short" // held by the gate too
		early := fedSubscriber(t, ctx, a, b, c, short)
		appended, scancel := gate.hold(t, ctx, a, short, "A", log[:3], nil)
		far := collectN(t, early, 3)[2].Cursor
		scancel()
		<-appended
		gate.open()
		a.EndFeed(short)
		waiting, err := b.Subscribe(ctx, short, far)
		if err != nil {
			t.Fatalf("resuming at %s of a running exec: %v", far, err)
		}
		c.Add(lease)
		if _, ok, err := b.TryFollow(ctx, short, "B", c.Now(), lease); err != nil || !ok {
			t.Fatalf("B takes over: %v %v", ok, err)
		}
		mustAppend(t, b, short, "B", nil, &Exit{ExitCode: -1, Error: "the sandbox was destroyed while the command ran"})
		for name, ch := range map[string]<-chan Event{"resumed on B": waiting, "A's own": early} {
			if evs := collect(t, ch, 10*time.Second); len(evs) != 0 {
				t.Fatalf("%s subscriber at %s, past the exit: got %+v, want none and the end", name, far, evs)
			}
		}
		if _, err := b.Read(ctx, short, far, 10, 0); !errors.Is(err, ErrBadCursor) {
			t.Fatalf("Read at %s past the exit: got %v, want ErrBadCursor", far, err)
		}
	})
}

// TestLiveFeedRetriedBatchOnce: an Append that failed after it offered its chunks (Redis did not
// answer in time) and is retried offers the same chunks again; the subscriber gets each once.
func TestLiveFeedRetriedBatchOnce(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		const id = "exec_retry"
		s, gate, other, c := gatedStore(t, srv, id)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		sub := fedSubscriber(t, ctx, s, other, c, id)
		log := series(0, numbered(0, 12)...)
		mustAppend(t, s, id, "A", log[:4], nil)
		failed, acancel := gate.hold(t, ctx, s, id, "A", log[4:8], nil)
		acancel()
		if err := <-failed; err == nil {
			t.Fatal("the held Append succeeded")
		}
		gate.open()
		mustAppend(t, s, id, "A", log[4:8], nil) // the follower's retry
		mustAppend(t, s, id, "A", log[8:], &Exit{ExitCode: 1})
		got := collect(t, sub, 10*time.Second)
		sameEvents(t, got, readAll(t, other, id, "", 100))
		checkChunks(t, got[:len(got)-1], log)
	})
}
