package execstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"sandboxd/internal/apierror"
	"sandboxd/internal/redistest"
)

// TestDroppedOutputIsATruncatedEvent: output the guest's bounded log could not keep never
// reached the stream; readers learn it from a truncated event just before the exit, also when
// they resume there, and the status counts it.
func TestDroppedOutputIsATruncatedEvent(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		create(t, s, c, "exec_drop")
		chunks := series(0, numbered(0, 3)...)
		mustAppend(t, s, "exec_drop", "A", chunks, &Exit{ExitCode: 0, Dropped: 4096})
		last := fmt.Sprintf("%d-0", chunks[2].Offset)
		for _, after := range []string{"", last} {
			evs := readAll(t, s, "exec_drop", after, 10)
			n := len(evs)
			if n < 2 || evs[n-2].Kind != EventTruncated || evs[n-2].Missed != 4096 || evs[n-2].Cursor != last ||
				evs[n-1].Kind != EventExit || evs[n-1].Exit.Dropped != 4096 {
				t.Fatalf("after %q: got %+v, want a truncated event of 4096 bytes at %s, then the exit", after, evs, last)
			}
		}
		m, err := s.Get(context.Background(), "exec_drop")
		if err != nil || m.Exit == nil || m.Exit.Dropped != 4096 {
			t.Fatalf("Get: %+v, %v", m, err)
		}
	})
}

// TestGapIsATruncatedEvent: a Gap chunk (output the guest's log dropped before it was copied)
// writes no entry; every reader, also one that resumes around it or subscribes live, gets a
// truncated event of exactly the gap's log bytes in its place, then the newer output, and the
// exit carries the exact byte counts.
func TestGapIsATruncatedEvent(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		create(t, s, c, "exec_gap")
		before := series(0, numbered(0, 2)...)
		gap := Chunk{Stream: Gap, Start: before[1].Offset, Offset: before[1].Offset + 10000}
		after := series(gap.Offset, numbered(2, 4)...)
		ctx := context.Background()
		sub, err := s.Subscribe(ctx, "exec_gap", "")
		if err != nil {
			t.Fatal(err)
		}
		mustAppend(t, s, "exec_gap", "A", append(append(slices.Clone(before), gap), after[0]), nil)
		if err := s.Append(ctx, "exec_gap", "A", []Chunk{{Stream: Gap, Start: after[0].Offset, Offset: after[0].Offset + 7, Data: []byte("x")}}, nil); err == nil {
			t.Fatal("a gap with data: got no error")
		}
		tail := Chunk{Stream: Gap, Start: after[1].Offset, Offset: after[1].Offset + 500}
		mustAppend(t, s, "exec_gap", "A", []Chunk{after[1], tail}, &Exit{ExitCode: 0, StdoutBytes: 123456, StderrBytes: 7})
		m, err := s.Get(ctx, "exec_gap")
		if err != nil || m.Offset != tail.Offset || m.Exit == nil || m.Exit.StdoutBytes != 123456 || m.Exit.StderrBytes != 7 {
			t.Fatalf("Get: %+v %+v, %v, want offset %d and the counts", m, m.Exit, err, tail.Offset)
		}
		var kinds []string
		want := "chunk,chunk,truncated:10000,chunk,chunk,truncated:500,exit"
		describe := func(evs []Event) string {
			kinds = kinds[:0]
			for _, ev := range evs {
				k := string(ev.Kind)
				if ev.Kind == EventTruncated {
					k += fmt.Sprintf(":%d", ev.Missed)
				}
				kinds = append(kinds, k)
			}
			return fmt.Sprint(kinds)
		}
		evs := readAll(t, s, "exec_gap", "", 3)
		if got := describe(evs); got != fmt.Sprint(strings.Split(want, ",")) {
			t.Fatalf("read: got %s, want %s", got, want)
		}
		if ex := evs[len(evs)-1].Exit; ex.StdoutBytes != 123456 || ex.StderrBytes != 7 {
			t.Errorf("exit event: got %+v, want the counts", ex)
		}
		if got := describe(collect(t, sub, 5*time.Second)); got != fmt.Sprint(strings.Split(want, ",")) {
			t.Fatalf("subscription: got %s, want %s", got, want)
		}
		// Resuming at the truncated event's cursor goes on with the output after the gap.
		resumed := readAll(t, s, "exec_gap", evs[2].Cursor, 10)
		if len(resumed) == 0 || resumed[0].Kind != EventChunk || !bytes.Equal(resumed[0].Data, after[0].Data) {
			t.Fatalf("resumed after the marker: got %+v", resumed)
		}
	})
}

func TestReadResumeFromMiddle(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		create(t, s, c, "exec_mid")
		want := series(0, numbered(0, 20)...)
		for i := 0; i < len(want); i += 4 {
			mustAppend(t, s, "exec_mid", "A", want[i:i+4], nil)
		}
		mustAppend(t, s, "exec_mid", "A", nil, &Exit{})
		for _, tc := range []struct {
			name  string
			after int // index of the last chunk already seen, -1 for none
			count int
		}{
			{"from_start", -1, 100},
			{"from_start_paged", -1, 3},
			{"after_first", 0, 100},
			{"after_middle", 9, 100},
			{"after_middle_paged", 9, 1},
			{"after_last_chunk", 19, 100},
		} {
			t.Run(tc.name, func(t *testing.T) {
				after := ""
				if tc.after >= 0 {
					after = fmt.Sprintf("%d-0", want[tc.after].Offset)
				}
				evs := readAll(t, s, "exec_mid", after, tc.count)
				if len(evs) == 0 || evs[len(evs)-1].Kind != EventExit {
					t.Fatalf("got %d events, want the exit last", len(evs))
				}
				checkChunks(t, evs[:len(evs)-1], want[tc.after+1:])
			})
		}
	})
}

func TestReadAfterExitEndsAtOnce(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{Block: 10 * time.Second})
		ctx := context.Background()
		create(t, s, c, "exec_done")
		ch := series(0, []byte("x"))
		mustAppend(t, s, "exec_done", "A", ch, &Exit{})
		exitCursor := fmt.Sprintf("%d-1", ch[0].Offset)
		t0 := time.Now()
		evs, err := s.Read(ctx, "exec_done", exitCursor, 10, 10*time.Second)
		if err != nil || len(evs) != 0 {
			t.Fatalf("read after exit: got %v, %v; want nothing", evs, err)
		}
		sub, err := s.Subscribe(ctx, "exec_done", exitCursor)
		if err != nil {
			t.Fatal(err)
		}
		if ev, ok := <-sub; ok {
			t.Fatalf("subscribe after exit: got %+v, want a closed channel", ev)
		}
		if d := time.Since(t0); d > 2*time.Second {
			t.Fatalf("reading after the exit took %v, want no wait", d)
		}
	})
}

func TestReadBlocksUntilAppend(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		create(t, s, c, "exec_wait")
		ch := series(0, []byte("late"))
		go func() {
			time.Sleep(100 * time.Millisecond)
			_ = s.Append(context.Background(), "exec_wait", "A", ch, nil)
		}()
		evs, err := s.Read(context.Background(), "exec_wait", "", 10, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		checkChunks(t, evs, ch)
	})
}

func TestCursorValidation(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		ctx := context.Background()
		create(t, s, c, "exec_cur")
		ch := series(0, []byte("0123456789"), []byte("abc")) // ends at 15 and 23
		mustAppend(t, s, "exec_cur", "A", ch, nil)
		check := func(t *testing.T, cases []struct {
			cursor string
			want   error
		}) {
			for _, tc := range cases {
				_, err := s.Read(ctx, "exec_cur", tc.cursor, 10, 0)
				if !errors.Is(err, tc.want) && !(tc.want == nil && err == nil) {
					t.Errorf("Read(%q): got %v, want %v", tc.cursor, err, tc.want)
				}
				sub, err := s.Subscribe(ctx, "exec_cur", tc.cursor)
				if tc.want != nil {
					if !errors.Is(err, tc.want) {
						t.Errorf("Subscribe(%q): got %v, want %v", tc.cursor, err, tc.want)
					}
					if !apierror.Is(err, apierror.InvalidArgument) {
						t.Errorf("Subscribe(%q): got code %s, want INVALID_ARGUMENT", tc.cursor, apierror.CodeOf(err))
					}
				} else if err != nil {
					t.Errorf("Subscribe(%q): got %v, want no error", tc.cursor, err)
				} else {
					_ = sub // drained by closing below
				}
			}
		}
		subCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		ctx = subCtx
		t.Run("running", func(t *testing.T) {
			check(t, []struct {
				cursor string
				want   error
			}{
				{"", nil}, {"0-0", nil}, {"15-0", nil}, {"23-0", nil},
				{"abc", ErrBadCursor}, {"15", ErrBadCursor}, {"-1-0", ErrBadCursor}, {"15-2", ErrBadCursor},
				{"23-1", ErrBadCursor}, {"99999999999999999999-0", ErrBadCursor},
				{"7-0", ErrBadCursor}, // inside the first chunk
				// Past the stored offset by up to MaxLead: a cursor of a chunk a follower's
				// replica handed its subscribers before Redis took it; further is never given.
				{"24-0", nil}, {strconv.Itoa(23+MaxLead) + "-0", nil}, {strconv.Itoa(24+MaxLead) + "-0", ErrBadCursor},
			})
		})
		mustAppend(t, s, "exec_cur", "A", nil, &Exit{})
		t.Run("ended", func(t *testing.T) {
			check(t, []struct {
				cursor string
				want   error
			}{
				{"23-0", nil}, {"23-1", nil}, {"15-1", ErrBadCursor}, {"24-0", ErrBadCursor},
			})
		})
		cancel()
		if _, err := s.Read(context.Background(), "exec_nope", "", 10, 0); !errors.Is(err, ErrNotFound) || !apierror.Is(err, apierror.NotFound) {
			t.Errorf("Read of an unknown exec: got %v, want ErrNotFound with NOT_FOUND", err)
		}
		if _, err := s.Subscribe(context.Background(), "exec_nope", ""); !errors.Is(err, ErrNotFound) {
			t.Errorf("Subscribe to an unknown exec: got %v, want ErrNotFound", err)
		}
		if _, err := s.Get(context.Background(), "exec_nope"); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get of an unknown exec: got %v, want ErrNotFound", err)
		}
		if _, err := s.Get(context.Background(), "bad{id}"); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get of a malformed id: got %v, want ErrNotFound", err)
		}
	})
}

func TestSubscribeJoinsMidStreamAndFollowsLive(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		create(t, s, c, "exec_live")
		want := series(0, numbered(0, 300)...)
		mustAppend(t, s, "exec_live", "A", want[:5], nil)
		sub, err := s.Subscribe(ctx, "exec_live", fmt.Sprintf("%d-0", want[1].Offset))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan []Event)
		go func() { done <- collect(t, sub, 30*time.Second) }()
		for i := 5; i < len(want); i += 7 {
			mustAppend(t, s, "exec_live", "A", want[i:min(i+7, len(want))], nil)
			if i%50 == 5 {
				time.Sleep(20 * time.Millisecond) // let the subscriber catch up and block
			}
		}
		exit := &Exit{ExitCode: 3, DurationMs: 9}
		mustAppend(t, s, "exec_live", "A", nil, exit)
		evs := <-done
		if len(evs) == 0 || evs[len(evs)-1].Kind != EventExit || *evs[len(evs)-1].Exit != *exit {
			t.Fatalf("got %d events, want the exit %+v last", len(evs), exit)
		}
		checkChunks(t, evs[:len(evs)-1], want[2:])
	})
}

func TestTruncated(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		ctx := context.Background()
		// A real Redis trims MAXLEN ~ by whole nodes (up to 100 entries), so write many more.
		s, c := newStore(srv, Options{MaxLen: 3})
		create(t, s, c, "exec_tr")
		want := series(0, numbered(0, 400)...)
		mustAppend(t, s, "exec_tr", "A", want[:1], nil)
		first, err := s.Read(ctx, "exec_tr", "", 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		checkChunks(t, first, want[:1])
		for _, ch := range want[1:] {
			mustAppend(t, s, "exec_tr", "A", []Chunk{ch}, nil)
		}
		mustAppend(t, s, "exec_tr", "A", nil, &Exit{ExitCode: 0})
		for _, tc := range []struct{ name, after string }{
			{"from_start", ""},
			{"from_a_trimmed_cursor", first[0].Cursor}, // the head was trimmed between two reads
		} {
			t.Run(tc.name, func(t *testing.T) {
				evs := readAll(t, s, "exec_tr", tc.after, 50)
				if len(evs) < 2 || evs[0].Kind != EventTruncated {
					t.Fatalf("first event: got %+v, want truncated", evs[0])
				}
				// The first retained chunk starts where the truncated event says.
				kept := slices.IndexFunc(want, func(c Chunk) bool { return fmt.Sprintf("%d-0", c.Offset) == evs[1].Cursor })
				if kept <= 1 {
					t.Fatalf("first retained chunk: got %s (index %d), want a later one", evs[1].Cursor, kept)
				}
				from := int64(0)
				if tc.after != "" {
					from = want[0].Offset
				}
				if evs[0].Missed != want[kept].Start-from || evs[0].Cursor != fmt.Sprintf("%d-0", want[kept].Start) {
					t.Fatalf("truncated: got missed %d cursor %s, want %d at %d-0", evs[0].Missed, evs[0].Cursor, want[kept].Start-from, want[kept].Start)
				}
				checkChunks(t, evs[1:len(evs)-1], want[kept:])
				// Resuming from the truncated event's cursor gives the retained output without a gap.
				again := readAll(t, s, "exec_tr", evs[0].Cursor, 50)
				checkChunks(t, again[:len(again)-1], want[kept:])
			})
		}
	})
}

func TestTruncatedByBytes(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{MaxBytes: 16 << 10})
		create(t, s, c, "exec_bytes")
		data := bytes.Repeat([]byte("x"), 1000)
		var want []Chunk
		start := int64(0)
		for range 200 {
			ch := chunk(Stdout, start, data)
			want = append(want, ch)
			start = ch.Offset
			mustAppend(t, s, "exec_bytes", "A", []Chunk{ch}, nil)
		}
		evs := readAll(t, s, "exec_bytes", "", 100)
		if len(evs) == 0 || evs[0].Kind != EventTruncated {
			t.Fatalf("got %d events, want a truncated one first", len(evs))
		}
		var kept int64
		for _, ev := range evs[1:] {
			kept += int64(len(ev.Data)) + 5
		}
		if kept < 16<<10 || kept > 64<<10 {
			t.Fatalf("kept %d log bytes, want about MaxBytes = %d", kept, 16<<10)
		}
		if evs[0].Missed+kept != start {
			t.Fatalf("missed %d + kept %d = %d, want the whole log %d", evs[0].Missed, kept, evs[0].Missed+kept, start)
		}
		checkChunks(t, evs[1:], want[len(want)-len(evs)+1:])
	})
}

func TestSlowSubscriberSeesTruncationNotAGap(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{MaxLen: 3, Buffer: 4})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		create(t, s, c, "exec_slow")
		sub, err := s.Subscribe(ctx, "exec_slow", "")
		if err != nil {
			t.Fatal(err)
		}
		want := series(0, numbered(0, 400)...)
		for _, ch := range want {
			mustAppend(t, s, "exec_slow", "A", []Chunk{ch}, nil)
		}
		mustAppend(t, s, "exec_slow", "A", nil, &Exit{ExitCode: 1})
		evs := collect(t, sub, 30*time.Second)
		// Every log byte is either delivered or reported missing, in order.
		var pos int64
		truncations := 0
		for i, ev := range evs {
			switch ev.Kind {
			case EventTruncated:
				truncations++
				pos += ev.Missed
			case EventChunk:
				k := slices.IndexFunc(want, func(c Chunk) bool { return c.Start == pos })
				if k < 0 || !bytes.Equal(want[k].Data, ev.Data) {
					t.Fatalf("event %d: got %q at %d, want the chunk starting there", i, ev.Data, pos)
				}
				pos = want[k].Offset
			case EventExit:
				if i != len(evs)-1 || ev.Exit.ExitCode != 1 {
					t.Fatalf("exit at %d of %d: %+v", i, len(evs), ev.Exit)
				}
			}
			if ev.Kind != EventExit && ev.Cursor != fmt.Sprintf("%d-0", pos) {
				t.Fatalf("event %d: cursor %s, want %d-0", i, ev.Cursor, pos)
			}
		}
		if truncations == 0 || pos != want[len(want)-1].Offset || evs[len(evs)-1].Kind != EventExit {
			t.Fatalf("got %d truncations, reached %d of %d, last %s; want a truncation, the whole log and the exit",
				truncations, pos, want[len(want)-1].Offset, evs[len(evs)-1].Kind)
		}
	})
}

func TestSlowSubscriberDoesNotBlockAppend(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{Buffer: 2})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		create(t, s, c, "exec_bp")
		data := bytes.Repeat([]byte("y"), 4<<10)
		var start int64
		// measure appends n chunks and returns the median Append latency.
		measure := func(n int) time.Duration {
			lat := make([]time.Duration, n)
			for i := range lat {
				ch := chunk(Stdout, start, data)
				t0 := time.Now()
				mustAppend(t, s, "exec_bp", "A", []Chunk{ch}, nil)
				lat[i] = time.Since(t0)
				start = ch.Offset
			}
			slices.Sort(lat)
			return lat[n/2]
		}
		measure(50) // warm up
		base := measure(300)
		// Eight subscribers that never read: each fills its buffer and then waits to send.
		for range 8 {
			if _, err := s.Subscribe(ctx, "exec_bp", ""); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(100 * time.Millisecond)
		stuck := measure(300)
		t.Logf("median Append latency: %v alone, %v with 8 stuck subscribers", base, stuck)
		if stuck > 2*base+time.Millisecond {
			t.Errorf("median Append latency with stuck subscribers: got %v, want about %v", stuck, base)
		}
		// Nor do they delay a subscriber that reads: it gets everything and the exit.
		fast, err := s.Subscribe(ctx, "exec_bp", "")
		if err != nil {
			t.Fatal(err)
		}
		mustAppend(t, s, "exec_bp", "A", nil, &Exit{})
		evs := collect(t, fast, 10*time.Second)
		if len(evs) != 651 || evs[650].Kind != EventExit {
			t.Fatalf("fast subscriber: got %d events, want 650 chunks and the exit", len(evs))
		}
	})
}

func TestSubscribeCancelLeaksNothing(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{Buffer: 1})
		create(t, s, c, "exec_cancel")
		mustAppend(t, s, "exec_cancel", "A", series(0, numbered(0, 10)...), nil)
		// One waits in a blocking read (caught up), one waits to send (never reads).
		waiting, cancelWaiting := context.WithCancel(context.Background())
		stuck, cancelStuck := context.WithCancel(context.Background())
		w, err := s.Subscribe(waiting, "exec_cancel", fmt.Sprintf("%d-0", series(0, numbered(0, 10)...)[9].Offset))
		if err != nil {
			t.Fatal(err)
		}
		st, err := s.Subscribe(stuck, "exec_cancel", "")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(150 * time.Millisecond)
		cancelWaiting()
		cancelStuck()
		for name, ch := range map[string]<-chan Event{"waiting": w, "stuck": st} {
			evs := collect(t, ch, 3*time.Second) // closes: its goroutine has returned
			if name == "waiting" && len(evs) != 0 {
				t.Errorf("%s: got %d events, want none", name, len(evs))
			}
		}
	})
}

// TestSubscribeAsChecksTheStatusFirst: a subscriber that must see the exec's status first gets
// it with the first output, in one round trip; the check's refusal comes before anything else
// (a bad cursor says nothing to a caller who may not see the exec), and an unknown exec never
// reaches the check.
func TestSubscribeAsChecksTheStatusFirst(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		create(t, s, c, "exec_as")
		ch := series(0, []byte("0123456789"), []byte("abc")) // ends at 15 and 23
		mustAppend(t, s, "exec_as", "A", ch, nil)
		trips := redistest.CountKeyTrips(srv.Client, "{exec_as}")

		var seen Meta
		// Counted in the check, which runs right after the first read: the subscription's own
		// reads that follow it (a blocking XREAD) may come before SubscribeAs returns.
		var n int
		sub, err := s.SubscribeAs(ctx, "exec_as", "", func(m Meta) error { seen, n = m, trips.Trips(); return nil })
		if err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("the subscription's first read took %d round trips, want 1", n)
		}
		if seen.ID != "exec_as" || seen.Tenant != "t" || seen.Project != "p" || seen.Sandbox != "sbx_1" || seen.State != Running ||
			seen.Offset != 23 || seen.Bytes != 13 {
			t.Errorf("the check got %+v, want the running exec's status at offset 23 with 13 bytes", seen)
		}
		mustAppend(t, s, "exec_as", "A", nil, &Exit{ExitCode: 4})
		got := collect(t, sub, 10*time.Second)
		checkChunks(t, got[:2], ch)
		if len(got) != 3 || got[2].Kind != EventExit || got[2].Exit.ExitCode != 4 {
			t.Fatalf("got %d events ending %+v, want the two chunks and the exit", len(got), got[len(got)-1])
		}

		refused := apierror.New(apierror.NotFound, "exec %q not found", "exec_as")
		for _, cursor := range []string{"", "15-0", "23-1", "abc", "7-0", "24-0", "15-1"} {
			_, err := s.SubscribeAs(ctx, "exec_as", cursor, func(Meta) error { return refused })
			if err != refused {
				t.Errorf("SubscribeAs(%q) with a refusing check: got %v, want the check's error", cursor, err)
			}
		}
		called := false
		for _, cursor := range []string{"", "abc"} {
			_, err := s.SubscribeAs(ctx, "exec_nope", cursor, func(Meta) error { called = true; return nil })
			if !errors.Is(err, ErrNotFound) {
				t.Errorf("SubscribeAs(exec_nope, %q): got %v, want ErrNotFound", cursor, err)
			}
		}
		if called {
			t.Error("the check was called for an exec that does not exist")
		}
		// A check that lets the caller through leaves the cursor to be judged as before.
		if _, err := s.SubscribeAs(ctx, "exec_as", "7-0", func(Meta) error { return nil }); !errors.Is(err, ErrBadCursor) {
			t.Errorf("SubscribeAs(7-0) with an accepting check: got %v, want ErrBadCursor", err)
		}
	})
}

// TestExitEventCarriesTheEnd: the exit event says when the exec ended and how many output
// bytes its stream took, exactly as its status does, from Redis and from the live window
// alike; an exit entry without them (an older version's) gives none.
func TestExitEventCarriesTheEnd(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		create(t, s, c, "exec_end")
		sub, err := s.Subscribe(ctx, "exec_end", "")
		if err != nil {
			t.Fatal(err)
		}
		held := s.live.watch("exec_end") // the window stays after the subscription ends
		defer held.unwatch()
		mustAppend(t, s, "exec_end", "A", series(0, []byte("hello "), []byte("world")), nil)
		c.Add(1500*time.Millisecond + 123*time.Microsecond)
		mustAppend(t, s, "exec_end", "A", series(21, []byte("!")), &Exit{ExitCode: 2, StdoutBytes: 12})
		m, err := s.Get(ctx, "exec_end")
		if err != nil {
			t.Fatal(err)
		}
		if m.Bytes != 12 || !m.EndedAt.Equal(c.Now().Truncate(time.Millisecond)) {
			t.Fatalf("status: %d bytes, ended %v; want 12 bytes, ended %v", m.Bytes, m.EndedAt, c.Now())
		}
		want := End{At: m.EndedAt, Bytes: m.Bytes}
		live := collect(t, sub, 10*time.Second)
		read := readAll(t, s, "exec_end", "", 100)
		sameEvents(t, live, read)
		for name, evs := range map[string][]Event{"subscription": live, "read": read} {
			last := evs[len(evs)-1]
			if last.Kind != EventExit || last.End == nil || *last.End != want {
				t.Errorf("%s: last event %s with end %+v, want the exit with %+v", name, last.Kind, last.End, want)
			}
		}
		// What the window fed the subscription held (whether or not it read from it in time).
		s.live.mu.Lock()
		entries := s.live.execs["exec_end"].entries
		if len(entries) == 0 || entries[len(entries)-1].end == nil || *entries[len(entries)-1].end != want {
			t.Errorf("the live window's exit entry: got %+v, want its end %+v", entries, want)
		}
		s.live.mu.Unlock()

		create(t, s, c, "exec_old")
		if err := srv.Client.XAdd(ctx, &redis.XAddArgs{Stream: outKey("exec_old"), ID: "0-1",
			Values: []any{"exit", "1", "code", "0", "start", "0"}}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := srv.Client.HSet(ctx, metaKey("exec_old"), "state", "ended").Err(); err != nil {
			t.Fatal(err)
		}
		old := readAll(t, s, "exec_old", "", 100)
		if len(old) != 1 || old[0].Kind != EventExit || old[0].End != nil {
			t.Errorf("an older exit entry: got %+v, want one exit event without an end", old)
		}
	})
}
