package execstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"sandboxd/internal/redistest"
)

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

// TestEndedMovesTheIndexes: Append of an exit leaves the indexes to Ended, which moves the exec
// from the running index to the ended one.
func TestEndedMovesTheIndexes(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		ctx := context.Background()
		create(t, s, c, "exec_done")
		if err := s.Append(ctx, "exec_done", "A", series(0, []byte("out")), &Exit{}); err != nil {
			t.Fatal(err)
		}
		indexes := func() (running, ended []string) {
			running, _ = srv.Client.ZRange(ctx, runningKey, 0, -1).Result()
			ended, _ = srv.Client.ZRange(ctx, endedKey, 0, -1).Result()
			return running, ended
		}
		if running, ended := indexes(); !slices.Equal(running, []string{"exec_done"}) || len(ended) != 0 {
			t.Fatalf("after the exit's append: running %v ended %v, want it still running in the index", running, ended)
		}
		if m, err := s.Get(ctx, "exec_done"); err != nil || m.State != Ended {
			t.Fatalf("after the exit's append: %+v %v, want state ended", m, err)
		}
		if err := s.Ended(ctx, "exec_done"); err != nil {
			t.Fatal(err)
		}
		if running, ended := indexes(); len(running) != 0 || !slices.Equal(ended, []string{"exec_done"}) {
			t.Fatalf("after Ended: running %v ended %v, want it moved", running, ended)
		}
		if err := s.Ended(ctx, "exec_{bad}"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Ended of an invalid id: %v, want ErrNotFound", err)
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
		// An ended exec the index still lists (its follower died before Ended, or Ended failed),
		// and a member whose meta hash is gone, long ago.
		create(t, s, c, "exec_over")
		if err := s.Append(ctx, "exec_over", "A", nil, &Exit{}); err != nil {
			t.Fatal(err)
		}
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
