package events

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"sandboxd/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func next(t *testing.T, ch <-chan Event) Event {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("stream closed, want an event")
		}
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5s")
	}
	return Event{}
}

func TestPublishSubscribeResume(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		b := New(srv.Client, Options{MaxLen: 1000})
		b.block = 100 * time.Millisecond
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// Only new events: nothing published before Subscribe arrives.
		if _, err := b.Publish(ctx, "t", "p", Event{Type: "X", SandboxID: "old"}); err != nil {
			t.Fatal(err)
		}
		all, err := b.Subscribe(ctx, "t", "p", "", "")
		if err != nil {
			t.Fatal(err)
		}
		one, err := b.Subscribe(ctx, "t", "p", "sbx_b", "")
		if err != nil {
			t.Fatal(err)
		}
		var cursors []string
		for i, id := range []string{"sbx_a", "sbx_b", "sbx_a", "sbx_b"} {
			c, err := b.Publish(ctx, "t", "p", Event{Type: "STATE_CHANGED", SandboxID: id, At: time.Now(),
				Fields: map[string]string{"state": fmt.Sprint(i)}})
			if err != nil {
				t.Fatal(err)
			}
			cursors = append(cursors, c)
		}
		// Another project's events never arrive.
		if _, err := b.Publish(ctx, "t", "other", Event{Type: "X", SandboxID: "sbx_a"}); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 4; i++ {
			ev := next(t, all)
			if ev.Cursor != cursors[i] || ev.Fields["state"] != fmt.Sprint(i) {
				t.Fatalf("event %d: got %+v, want cursor %s state %d", i, ev, cursors[i], i)
			}
		}
		for _, i := range []int{1, 3} {
			if ev := next(t, one); ev.SandboxID != "sbx_b" || ev.Cursor != cursors[i] {
				t.Fatalf("filtered: got %+v, want sbx_b at %s", ev, cursors[i])
			}
		}
		// Resume after the second event: exactly the third and fourth follow.
		resumed, err := b.Subscribe(ctx, "t", "p", "", cursors[1])
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range []int{2, 3} {
			if ev := next(t, resumed); ev.Cursor != cursors[i] {
				t.Fatalf("resumed: got %s, want %s", ev.Cursor, cursors[i])
			}
		}
		if _, err := b.Subscribe(ctx, "t", "p", "", "not-a-cursor"); err != ErrBadCursor {
			t.Fatalf("bad cursor: got %v, want ErrBadCursor", err)
		}
		// Cancelling ends every subscription (goleak checks the readers are gone).
		cancel()
		for _, ch := range []<-chan Event{all, one, resumed} {
			for range ch {
			}
		}
	})
}

func TestStreamIsBounded(t *testing.T) {
	srv := redistest.Embedded(t)
	b := New(srv.Client, Options{MaxLen: 50})
	ctx := context.Background()
	for i := 0; i < 500; i++ {
		if _, err := b.Publish(ctx, "t", "p", Event{Type: "X", SandboxID: "s"}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := srv.Client.XLen(ctx, streamKey("t", "p")).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n > 150 {
		t.Fatalf("stream holds %d events, want about 50", n)
	}
}

// TestSubscribersDoNotStarvePublishers: waiting subscribers use their own client, so
// publishing (and everything else on the main client) goes on; beyond MaxSubscribers a
// subscription is refused rather than queued.
func TestSubscribersDoNotStarvePublishers(t *testing.T) {
	srv := redistest.Start(t)
	main := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 2, PoolTimeout: 500 * time.Millisecond})
	defer main.Close()
	blocking := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 40, PoolTimeout: time.Second})
	defer blocking.Close()
	b := New(main, Options{Blocking: blocking, MaxSubscribers: 30})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var subs []<-chan Event
	for i := 0; i < 30; i++ {
		ch, err := b.Subscribe(ctx, "t", "p", "", "")
		if err != nil {
			t.Fatalf("subscription %d: %v", i, err)
		}
		subs = append(subs, ch)
	}
	if _, err := b.Subscribe(ctx, "t", "p", "", ""); err != ErrTooManySubscribers {
		t.Fatalf("subscription 31: got %v, want ErrTooManySubscribers", err)
	}
	time.Sleep(200 * time.Millisecond) // every subscriber is now waiting in XREAD BLOCK
	start := time.Now()
	if _, err := b.Publish(ctx, "t", "p", Event{Type: "X", SandboxID: "s"}); err != nil {
		t.Fatalf("publish with 30 waiting subscribers on a 2-connection main pool: %v", err)
	}
	if d := time.Since(start); d > 400*time.Millisecond {
		t.Fatalf("publish took %v with subscribers waiting, want it unaffected", d)
	}
	for i, ch := range subs {
		if ev := next(t, ch); ev.SandboxID != "s" {
			t.Fatalf("subscriber %d: got %+v", i, ev)
		}
	}
	cancel()
	for _, ch := range subs {
		for range ch {
		}
	}
	// Slots come back when subscriptions end.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	if _, err := b.Subscribe(ctx2, "t", "p", "", ""); err != nil {
		t.Fatalf("after the others ended: %v", err)
	}
}

// TestOneReaderPerProject: many subscribers of one project share one blocking read, and a
// subscriber that does not read for a while loses nothing and gets nothing twice.
func TestOneReaderPerProject(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		blocking := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 50})
		defer blocking.Close()
		b := New(srv.Client, Options{Blocking: blocking, MaxLen: 100000})
		b.block = 200 * time.Millisecond
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		const n = 200
		var subs []<-chan Event
		for i := 0; i < n; i++ {
			ch, err := b.Subscribe(ctx, "t", "p", "", "")
			if err != nil {
				t.Fatal(err)
			}
			subs = append(subs, ch)
		}
		time.Sleep(500 * time.Millisecond)
		if got := blocking.PoolStats().TotalConns; got > 2 {
			t.Fatalf("%d subscribers of one project hold %d blocking connections, want 1", n, got)
		}
		// 1,000 events while nobody reads: every live queue overflows.
		const events = 1000
		for i := 0; i < events; i++ {
			if _, err := b.Publish(ctx, "t", "p", Event{Type: "X", SandboxID: "s", Fields: map[string]string{"i": fmt.Sprint(i)}}); err != nil {
				t.Fatal(err)
			}
		}
		for k, ch := range []<-chan Event{subs[0], subs[n/2], subs[n-1]} {
			for i := 0; i < events; i++ {
				if ev := next(t, ch); ev.Fields["i"] != fmt.Sprint(i) {
					t.Fatalf("subscriber %d, event %d: got %q, want %d (no loss, no duplicate, in order)", k, i, ev.Fields["i"], i)
				}
			}
		}
		cancel()
		for _, ch := range subs {
			for range ch {
			}
		}
	})
}
