package execstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"sandboxd/internal/apierror"
	"sandboxd/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is an injected clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

const lease = 10 * time.Second

// newStore returns a Store on srv with a fake clock and short blocking reads.
func newStore(srv *redistest.Server, opts Options) (*Store, *clock) {
	c := newClock()
	if opts.Now == nil {
		opts.Now = c.Now
	}
	if opts.Block == 0 {
		opts.Block = 100 * time.Millisecond
	}
	return New(srv.Client, opts), c
}

// create registers exec id followed by token "A".
func create(t testing.TB, s *Store, c *clock, id string) {
	t.Helper()
	err := s.Create(context.Background(), Meta{ID: id, Tenant: "t", Project: "p", Sandbox: "sbx_1", Argv: "sh -c 'echo hi'"},
		"A", c.Now(), lease)
	if err != nil {
		t.Fatal(err)
	}
}

// chunk is one guest record's worth of output starting at start.
func chunk(stream Stream, start int64, data []byte) Chunk {
	return Chunk{Stream: stream, Data: data, Start: start, Offset: start + 5 + int64(len(data))}
}

// series builds contiguous chunks from start.
func series(start int64, datas ...[]byte) []Chunk {
	out := make([]Chunk, 0, len(datas))
	for i, d := range datas {
		st := Stdout
		if i%3 == 2 {
			st = Stderr
		}
		c := chunk(st, start, d)
		out = append(out, c)
		start = c.Offset
	}
	return out
}

func numbered(from, to int) [][]byte {
	var out [][]byte
	for i := from; i < to; i++ {
		out = append(out, fmt.Appendf(nil, "line %d\n", i))
	}
	return out
}

func mustAppend(t testing.TB, s *Store, id, token string, chunks []Chunk, exit *Exit) {
	t.Helper()
	if err := s.Append(context.Background(), id, token, chunks, exit); err != nil {
		t.Fatal(err)
	}
}

// readAll reads from after until the exit event (or nothing more comes).
func readAll(t *testing.T, s *Store, id, after string, count int) []Event {
	t.Helper()
	var all []Event
	for range 10000 {
		evs, err := s.Read(context.Background(), id, after, count, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			return all
		}
		all = append(all, evs...)
		after = evs[len(evs)-1].Cursor
		if evs[len(evs)-1].Kind == EventExit {
			return all
		}
	}
	t.Fatal("readAll did not end")
	return nil
}

// checkChunks compares chunk events with the chunks written.
func checkChunks(t *testing.T, got []Event, want []Chunk) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d chunk events, want %d", len(got), len(want))
	}
	for i, ev := range got {
		w := want[i]
		if ev.Kind != EventChunk || ev.Stream != w.Stream || !bytes.Equal(ev.Data, w.Data) || ev.Cursor != fmt.Sprintf("%d-0", w.Offset) {
			t.Fatalf("event %d: got %s %s %q cursor %s, want chunk %s %q cursor %d-0", i, ev.Kind, ev.Stream, ev.Data, ev.Cursor, w.Stream, w.Data, w.Offset)
		}
	}
}

func TestAppendReadRoundTrip(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		ctx := context.Background()
		create(t, s, c, "exec_rt")
		big := make([]byte, 64<<10)
		for i := range big {
			big[i] = byte(rand.IntN(256))
		}
		want := series(0, []byte{0, 1, 2, 0xff, 0xfe, '\n', 0xc3, 0x28}, []byte("plain\r\n"), []byte{}, big, []byte("\x00end\x00"))
		mustAppend(t, s, "exec_rt", "A", want[:2], nil)
		mustAppend(t, s, "exec_rt", "A", want[2:], nil)
		exit := &Exit{ExitCode: 137, Signal: "SIGKILL", TimedOut: true, DurationMs: 1234, Error: "killed after the timeout"}
		mustAppend(t, s, "exec_rt", "A", nil, exit)

		evs, err := s.Read(ctx, "exec_rt", "", 100, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != len(want)+1 {
			t.Fatalf("got %d events, want %d", len(evs), len(want)+1)
		}
		checkChunks(t, evs[:len(want)], want)
		last := evs[len(want)]
		end := want[len(want)-1].Offset
		if last.Kind != EventExit || *last.Exit != *exit || last.Cursor != fmt.Sprintf("%d-1", end) {
			t.Fatalf("last event: got %+v (exit %+v), want exit %+v at %d-1", last, last.Exit, exit, end)
		}
		m, err := s.Get(ctx, "exec_rt")
		if err != nil {
			t.Fatal(err)
		}
		var total int64
		for _, c := range want {
			total += int64(len(c.Data))
		}
		if m.State != Ended || m.Offset != end || m.Bytes != total || m.Exit == nil || *m.Exit != *exit ||
			m.Tenant != "t" || m.Project != "p" || m.Sandbox != "sbx_1" || m.Argv != "sh -c 'echo hi'" ||
			!m.StartedAt.Equal(c.Now()) || !m.EndedAt.Equal(c.Now()) || !m.LeaseUntil.IsZero() {
			t.Fatalf("meta: got %+v, want ended at offset %d with %d bytes and exit %+v", m, end, total, exit)
		}
		// Appending after the end is refused.
		if err := s.Append(ctx, "exec_rt", "A", series(end, []byte("late")), nil); !errors.Is(err, ErrEnded) {
			t.Fatalf("append after exit: got %v, want ErrEnded", err)
		}
		if _, ok, err := s.TryFollow(ctx, "exec_rt", "B", c.Now(), lease); ok || !errors.Is(err, ErrEnded) {
			t.Fatalf("follow after exit: got ok=%v err=%v, want ErrEnded", ok, err)
		}
	})
}

func TestExitWithoutOutput(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		create(t, s, c, "exec_empty")
		mustAppend(t, s, "exec_empty", "A", nil, &Exit{ExitCode: 127, Error: "executable file not found"})
		evs := readAll(t, s, "exec_empty", "", 10)
		if len(evs) != 1 || evs[0].Kind != EventExit || evs[0].Cursor != "0-1" || evs[0].Exit.ExitCode != 127 {
			t.Fatalf("got %+v, want one exit event at 0-1", evs)
		}
	})
}

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
				{"24-0", ErrBadCursor}, {"23-1", ErrBadCursor}, {"99999999999999999999-0", ErrBadCursor},
				{"7-0", ErrBadCursor}, // inside the first chunk
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

func TestCreateTwiceIsRefused(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		create(t, s, c, "exec_dup")
		err := s.Create(context.Background(), Meta{ID: "exec_dup"}, "B", c.Now(), lease)
		if !errors.Is(err, ErrExists) || !apierror.Is(err, apierror.AlreadyExists) {
			t.Fatalf("second create: got %v, want ErrExists", err)
		}
		if m, _ := s.Get(context.Background(), "exec_dup"); m.Follower != "A" || m.Tenant != "t" {
			t.Fatalf("meta after a refused create: got %+v, want the first one", m)
		}
		if err := s.Create(context.Background(), Meta{ID: "a{b"}, "", c.Now(), lease); !apierror.Is(err, apierror.InvalidArgument) {
			t.Fatalf("create with a brace in the id: got %v, want INVALID_ARGUMENT", err)
		}
	})
}

// collect reads a subscription until it closes.
func collect(t *testing.T, ch <-chan Event, within time.Duration) []Event {
	t.Helper()
	var out []Event
	timeout := time.After(within)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return out
			}
			out = append(out, ev)
		case <-timeout:
			t.Fatalf("subscription still open after %v (%d events)", within, len(out))
		}
	}
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

func TestFencing(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		ctx := context.Background()
		create(t, s, c, "exec_fence") // follower A until now+10s
		want := series(0, []byte("one\n"), []byte("two\n"), []byte("three\n"))
		mustAppend(t, s, "exec_fence", "A", want[:1], nil)
		// A renews; B cannot take over a live lease.
		if off, ok, err := s.TryFollow(ctx, "exec_fence", "A", c.Now(), lease); err != nil || !ok || off != want[0].Offset {
			t.Fatalf("renew: got %d %v %v, want %d true", off, ok, err, want[0].Offset)
		}
		if _, ok, err := s.TryFollow(ctx, "exec_fence", "B", c.Now().Add(lease-time.Millisecond), lease); err != nil || ok {
			t.Fatalf("B during A's lease: got ok=%v err=%v, want refused", ok, err)
		}
		// A stalls past its lease: it may not write any more, even before anyone took over.
		c.Add(lease)
		if err := s.Append(ctx, "exec_fence", "A", want[1:2], nil); !errors.Is(err, ErrNotFollower) {
			t.Fatalf("A after its lease: got %v, want ErrNotFollower", err)
		}
		off, ok, err := s.TryFollow(ctx, "exec_fence", "B", c.Now(), lease)
		if err != nil || !ok || off != want[0].Offset {
			t.Fatalf("B takes over: got %d %v %v, want %d true", off, ok, err, want[0].Offset)
		}
		if _, ok, _ := s.TryFollow(ctx, "exec_fence", "A", c.Now(), lease); ok {
			t.Fatal("A took the lease back from B")
		}
		if err := s.Append(ctx, "exec_fence", "A", want[1:2], nil); !errors.Is(err, ErrNotFollower) {
			t.Fatalf("A after the takeover: got %v, want ErrNotFollower", err)
		}
		// B resumes exactly at the stored offset.
		mustAppend(t, s, "exec_fence", "B", want[1:], &Exit{})
		evs := readAll(t, s, "exec_fence", "", 100)
		checkChunks(t, evs[:len(evs)-1], want)
		// Release lets another replica take over at once.
		create(t, s, c, "exec_rel")
		if held, err := s.Release(ctx, "exec_rel", "B"); err != nil || held {
			t.Fatalf("release by a non-holder: got %v %v, want false", held, err)
		}
		if held, err := s.Release(ctx, "exec_rel", "A"); err != nil || !held {
			t.Fatalf("release: got %v %v, want true", held, err)
		}
		if _, ok, err := s.TryFollow(ctx, "exec_rel", "B", c.Now(), lease); err != nil || !ok {
			t.Fatalf("follow after release: got ok=%v err=%v, want ok", ok, err)
		}
	})
}

func TestAppendRefusesWrongOffsets(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		ctx := context.Background()
		create(t, s, c, "exec_off")
		first := series(0, []byte("hello"), []byte("world")) // ends at 10, 20
		mustAppend(t, s, "exec_off", "A", first, nil)
		for _, tc := range []struct {
			name   string
			chunks []Chunk
			want   error
		}{
			{"duplicate", series(10, []byte("world")), ErrOffset},
			{"from_zero", series(0, []byte("hello")), ErrOffset},
			{"gap", series(25, []byte("later")), ErrOffset},
			{"not_contiguous", []Chunk{chunk(Stdout, 20, []byte("a")), chunk(Stdout, 30, []byte("b"))}, ErrOffset},
			{"empty_range", []Chunk{{Stream: Stdout, Start: 20, Offset: 20}}, nil},
			{"bad_stream", []Chunk{{Stream: "stdin", Data: []byte("x"), Start: 20, Offset: 26}}, nil},
		} {
			t.Run(tc.name, func(t *testing.T) {
				err := s.Append(ctx, "exec_off", "A", tc.chunks, nil)
				if err == nil || tc.want != nil && !errors.Is(err, tc.want) {
					t.Fatalf("got %v, want %v", err, tc.want)
				}
			})
		}
		// Nothing was written by the refused calls.
		m, err := s.Get(ctx, "exec_off")
		if err != nil || m.Offset != 20 || m.Bytes != 10 {
			t.Fatalf("meta: got offset %d bytes %d (%v), want 20 and 10", m.Offset, m.Bytes, err)
		}
		evs, _ := s.Read(ctx, "exec_off", "", 100, 0)
		checkChunks(t, evs, first)
		if err := s.Append(ctx, "exec_nope", "A", first, nil); !errors.Is(err, ErrNotFound) {
			t.Fatalf("append to an unknown exec: got %v, want ErrNotFound", err)
		}
	})
}

func TestTryFollowRace(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		ctx := context.Background()
		for round := range 10 {
			id := fmt.Sprint("exec_race_", round)
			if err := s.Create(ctx, Meta{ID: id}, "", c.Now(), 0); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			var winners []string
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					token := fmt.Sprint("replica-", g)
					_, ok, err := s.TryFollow(ctx, id, token, c.Now(), lease)
					if err != nil {
						t.Error(err)
					}
					if ok {
						mu.Lock()
						winners = append(winners, token)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			m, _ := s.Get(ctx, id)
			if len(winners) != 1 || m.Follower != winners[0] {
				t.Fatalf("round %d: got winners %v and follower %q, want exactly one", round, winners, m.Follower)
			}
		}
	})
}

func TestOrphans(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		ctx := context.Background()
		create(t, s, c, "exec_followed") // A until now+10s
		if err := s.Create(ctx, Meta{ID: "exec_unfollowed", Tenant: "t", Project: "p", Sandbox: "sbx_2"}, "", c.Now(), 0); err != nil {
			t.Fatal(err)
		}
		create(t, s, c, "exec_over")
		mustAppend(t, s, "exec_over", "A", nil, &Exit{})
		// An ended exec the index still lists (the index move failed), and a member whose meta
		// hash is gone, long ago.
		srv.Client.ZAdd(ctx, runningKey, redisZ("exec_over", c.Now()))
		srv.Client.ZAdd(ctx, runningKey, redisZ("exec_gone", c.Now().Add(-time.Hour)))
		ids := func(ms []Meta) []string {
			var out []string
			for _, m := range ms {
				out = append(out, m.ID)
			}
			sort.Strings(out)
			return out
		}
		got, err := s.Orphans(ctx, c.Now())
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"exec_unfollowed"}; !slices.Equal(ids(got), want) || got[0].Sandbox != "sbx_2" {
			t.Fatalf("orphans now: got %v, want %v", ids(got), want)
		}
		running, _ := srv.Client.ZRange(ctx, runningKey, 0, -1).Result()
		ended, _ := srv.Client.ZRange(ctx, endedKey, 0, -1).Result()
		if sort.Strings(running); !slices.Equal(running, []string{"exec_followed", "exec_unfollowed"}) || !slices.Equal(ended, []string{"exec_over"}) {
			t.Fatalf("indexes after repair: running %v ended %v", running, ended)
		}
		got, err = s.Orphans(ctx, c.Now().Add(lease))
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"exec_followed", "exec_unfollowed"}; !slices.Equal(ids(got), want) {
			t.Fatalf("orphans after the lease: got %v, want %v", ids(got), want)
		}
	})
}

func redisZ(id string, at time.Time) redis.Z {
	return redis.Z{Score: float64(at.UnixMilli()), Member: id}
}

func TestSweep(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{Retention: time.Hour})
		ctx := context.Background()
		t0 := c.Now()
		create(t, s, c, "exec_old")
		mustAppend(t, s, "exec_old", "A", series(0, []byte("old")), &Exit{})
		c.Add(50 * time.Minute)
		create(t, s, c, "exec_recent")
		mustAppend(t, s, "exec_recent", "A", series(0, []byte("recent")), &Exit{})
		create(t, s, c, "exec_running")
		mustAppend(t, s, "exec_running", "A", series(0, []byte("still going")), nil)

		exists := func(id string) bool {
			_, err := s.Get(ctx, id)
			if err != nil && !errors.Is(err, ErrNotFound) {
				t.Fatal(err)
			}
			n, _ := srv.Client.Exists(ctx, outKey(id)).Result()
			if (err == nil) != (n == 1) {
				t.Fatalf("%s: meta present %v, stream present %v", id, err == nil, n == 1)
			}
			return err == nil
		}
		for _, tc := range []struct {
			name string
			now  time.Time
			want int
			kept map[string]bool
		}{
			{"before_retention", t0.Add(59 * time.Minute), 0, map[string]bool{"exec_old": true, "exec_recent": true, "exec_running": true}},
			{"old_one_expired", t0.Add(time.Hour), 1, map[string]bool{"exec_old": false, "exec_recent": true, "exec_running": true}},
			{"all_ended_expired", t0.Add(10 * time.Hour), 1, map[string]bool{"exec_old": false, "exec_recent": false, "exec_running": true}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				n, err := s.Sweep(ctx, tc.now)
				if err != nil || n != tc.want {
					t.Fatalf("got %d %v, want %d", n, err, tc.want)
				}
				for id, want := range tc.kept {
					if got := exists(id); got != want {
						t.Errorf("%s: got present %v, want %v", id, got, want)
					}
				}
			})
		}
		if _, err := s.Read(ctx, "exec_old", "", 10, 0); !errors.Is(err, ErrNotFound) {
			t.Fatalf("read of a swept exec: got %v, want ErrNotFound", err)
		}
		if n, _ := srv.Client.ZCard(ctx, endedKey).Result(); n != 0 {
			t.Fatalf("ended index: got %d members, want 0", n)
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

func TestSummarize(t *testing.T) {
	long := make([]string, 100)
	for i := range long {
		long[i] = "argument"
	}
	for _, tc := range []struct {
		name string
		argv []string
		want string
	}{
		{"plain", []string{"ls", "-la", "/workspace"}, "ls -la /workspace"},
		{"quoted", []string{"sh", "-c", "echo 'hi' && exit 1"}, `sh -c 'echo '\''hi'\'' && exit 1'`},
		{"empty_arg", []string{"printf", ""}, "printf ''"},
		{"none", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Summarize(tc.argv); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	t.Run("long", func(t *testing.T) {
		got := Summarize(long)
		if len(got) > maxArgv || got[len(got)-len("…"):] != "…" {
			t.Fatalf("got %d bytes %q, want at most %d ending in …", len(got), got, maxArgv)
		}
	})
}

// TestTakeoverDeliversEveryByteOnce plays two followers copying one guest log: A dies in the
// middle (it stops renewing, and its last batch comes too late), the reconciler finds the exec
// orphaned, B takes over from the stored offset; a subscriber that followed from the start gets
// the log's output exactly once, in order, and the exit.
func TestTakeoverDeliversEveryByteOnce(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		create(t, s, c, "exec_take")
		log := series(0, numbered(0, 500)...) // the guest init's log
		var want []byte
		for _, ch := range log {
			want = append(want, ch.Data...)
		}
		sub, err := s.Subscribe(ctx, "exec_take", "")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan []Event)
		go func() { done <- collect(t, sub, 30*time.Second) }()

		// follow copies the log from offset in batches of 7 until stop records have been copied.
		follow := func(token string, offset int64, stop int) error {
			i := slices.IndexFunc(log, func(ch Chunk) bool { return ch.Start == offset })
			if i < 0 {
				t.Fatalf("%s: offset %d is not a record boundary", token, offset)
			}
			for ; i < stop; i += 7 {
				if err := s.Append(ctx, "exec_take", token, log[i:min(i+7, stop)], nil); err != nil {
					return err
				}
			}
			return nil
		}
		if err := follow("A", 0, 203); err != nil {
			t.Fatal(err)
		}
		c.Add(lease) // A stalls
		orphans, err := s.Orphans(ctx, c.Now())
		if err != nil || len(orphans) != 1 || orphans[0].ID != "exec_take" {
			t.Fatalf("orphans: got %v %v, want exec_take", orphans, err)
		}
		off, ok, err := s.TryFollow(ctx, "exec_take", "B", c.Now(), lease)
		if err != nil || !ok || off != log[202].Offset {
			t.Fatalf("B: got %d %v %v, want offset %d", off, ok, err, log[202].Offset)
		}
		if err := follow("A", log[203].Start, 250); !errors.Is(err, ErrNotFollower) {
			t.Fatalf("A's late batch: got %v, want ErrNotFollower", err)
		}
		if err := follow("B", off, len(log)); err != nil {
			t.Fatal(err)
		}
		mustAppend(t, s, "exec_take", "B", nil, &Exit{ExitCode: 0, DurationMs: 42})
		evs := <-done
		var got []byte
		for _, ev := range evs[:len(evs)-1] {
			if ev.Kind != EventChunk {
				t.Fatalf("got a %s event, want only chunks before the exit", ev.Kind)
			}
			got = append(got, ev.Data...)
		}
		if !bytes.Equal(got, want) || evs[len(evs)-1].Kind != EventExit {
			t.Fatalf("got %d bytes (last event %s), want the log's %d bytes and the exit", len(got), evs[len(evs)-1].Kind, len(want))
		}
	})
}

// TestSweepKeepsEndedOutputUnderBudget: beyond MaxEndedBytes of ended output, the oldest ended
// execs go first, before their retention ends; running ones stay whatever their size.
func TestSweepKeepsEndedOutputUnderBudget(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{Retention: time.Hour, MaxEndedBytes: 2500})
		ctx := context.Background()
		big := bytes.Repeat([]byte("x"), 995) // 1000 guest log bytes with the record header
		for _, id := range []string{"exec_b1", "exec_b2", "exec_b3", "exec_b4"} {
			create(t, s, c, id)
			mustAppend(t, s, id, "A", series(0, big), &Exit{})
			c.Add(time.Second)
		}
		create(t, s, c, "exec_brun")
		mustAppend(t, s, "exec_brun", "A", series(0, bytes.Repeat(big, 5)), nil)
		n, err := s.Sweep(ctx, c.Now())
		if err != nil || n != 2 {
			t.Fatalf("sweep: got %d %v, want the 2 oldest of 4 ended execs of 1000 bytes under a budget of 2500", n, err)
		}
		for id, want := range map[string]bool{"exec_b1": false, "exec_b2": false, "exec_b3": true, "exec_b4": true, "exec_brun": true} {
			_, err := s.Get(ctx, id)
			if got := err == nil; got != want {
				t.Errorf("%s: present %v, want %v (%v)", id, got, want, err)
			}
		}
		if n, _ := srv.Client.ZCard(ctx, endedKey).Result(); n != 2 {
			t.Errorf("ended index: %d members, want 2", n)
		}
	})
}
