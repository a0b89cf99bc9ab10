package execstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

// mustAppend appends as a follower does: an appended exit is followed by Ended.
func mustAppend(t testing.TB, s *Store, id, token string, chunks []Chunk, exit *Exit) {
	t.Helper()
	if err := s.Append(context.Background(), id, token, chunks, exit); err != nil {
		t.Fatal(err)
	}
	if exit != nil {
		if err := s.Ended(context.Background(), id); err != nil {
			t.Fatal(err)
		}
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

func redisZ(id string, at time.Time) redis.Z {
	return redis.Z{Score: float64(at.UnixMilli()), Member: id}
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
