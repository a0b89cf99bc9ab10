package events

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"sandboxd/internal/offstack"
)

// A hub is this replica's one reader of one project's stream: it waits in XREAD BLOCK on a
// connection of the blocking pool and fans each new entry out to the live local subscribers,
// never blocking on them. A subscriber starts by catching up from its own cursor with plain
// (non-blocking) XRANGE reads, joins the hub once it has reached the hub's position, and falls
// back to catching up when it is too slow to take what the hub hands it. So 1,000 idle
// subscriptions of one project hold one Redis connection, not 1,000, and a slow subscriber
// loses nothing and slows nobody.
type hub struct {
	b   *Bus
	key string

	mu   sync.Mutex
	subs map[*subscriber]bool // value: live
	last string               // the last entry id the hub has read and fanned out
	stop context.CancelFunc
	done chan struct{}
}

type subscriber struct {
	// live receives batches of entries from the hub while the subscriber is live: each batch is
	// one read of the hub's, shared by every subscriber and never written to.
	live chan []redis.XMessage
	// fell is signalled when the hub dropped the subscriber for being too slow.
	fell chan struct{}
}

// liveBuffer is how many batches (reads of the hub's, up to 500 entries each) the hub may queue
// for one live subscriber. A queue holds slice headers, not entries: 10,000 idle subscribers
// cost 24 B each per place, and a burst of entries costs each subscriber one place.
const liveBuffer = 32

// join registers s with the hub of key, creating and starting the hub if needed. The
// subscriber starts as not live.
func (b *Bus) join(key string, s *subscriber) *hub {
	b.hubMu.Lock()
	defer b.hubMu.Unlock()
	h := b.hubs[key]
	if h == nil {
		ctx, cancel := context.WithCancel(context.Background())
		h = &hub{b: b, key: key, subs: map[*subscriber]bool{}, stop: cancel, done: make(chan struct{})}
		b.hubs[key] = h
		go h.run(ctx)
	}
	h.mu.Lock()
	h.subs[s] = false
	h.mu.Unlock()
	return h
}

// leave removes s; the last subscriber to leave stops the hub.
func (b *Bus) leave(h *hub, s *subscriber) {
	b.hubMu.Lock()
	h.mu.Lock()
	delete(h.subs, s)
	empty := len(h.subs) == 0
	h.mu.Unlock()
	if empty && b.hubs[h.key] == h {
		delete(b.hubs, h.key)
		h.stop()
	}
	b.hubMu.Unlock()
}

// goLive makes s live if its cursor has reached the hub's position; it reports whether it did.
func (h *hub) goLive(s *subscriber, cursor string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last == "" || compareIDs(cursor, h.last) < 0 {
		return false
	}
	h.subs[s] = true
	return true
}

// run reads the stream and fans entries out until stopped.
func (h *hub) run(ctx context.Context) {
	defer close(h.done)
	// Start at the stream's current end: subscribers catch up to here on their own.
	cursor := "0-0"
	for ctx.Err() == nil {
		last, err := h.b.rdb.XRevRangeN(ctx, h.key, "+", "-", 1).Result()
		if err == nil {
			if len(last) == 1 {
				cursor = last[0].ID
			}
			break
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return
		}
	}
	h.mu.Lock()
	h.last = cursor
	h.mu.Unlock()
	failures := 0
	for ctx.Err() == nil {
		res, err := h.b.blocking.XRead(ctx, &redis.XReadArgs{Streams: []string{h.key, cursor}, Count: 500, Block: h.b.block}).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			if !sleepCtx(ctx, time.Duration(min(failures, 20))*50*time.Millisecond) {
				return
			}
			continue
		}
		failures = 0
		for _, st := range res {
			if len(st.Messages) == 0 {
				continue
			}
			h.fanOut(st.Messages)
			cursor = st.Messages[len(st.Messages)-1].ID
		}
	}
}

// fanOut hands one read of entries, as one batch, to every live subscriber without blocking; one
// whose queue is full is dropped to catching up (it re-reads from its own cursor).
func (h *hub) fanOut(msgs []redis.XMessage) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s, live := range h.subs {
		if !live {
			continue
		}
		select {
		case s.live <- msgs:
			continue
		default:
		}
		h.subs[s] = false
		select {
		case s.fell <- struct{}{}:
		default:
		}
	}
	h.last = msgs[len(msgs)-1].ID
}

// follow is one subscriber's loop: catch up from Redis, then take entries from the hub, and
// back to catching up when it fell behind. It returns when ctx ends, when send refuses an
// event (false), or when Redis fails for good.
func (b *Bus) follow(ctx context.Context, key, sandboxID, cursor string, send func(Event) bool) {
	s := &subscriber{live: make(chan []redis.XMessage, liveBuffer), fell: make(chan struct{}, 1)}
	h := b.join(key, s)
	defer b.leave(h, s)
	deliver := func(m redis.XMessage) bool {
		if compareIDs(m.ID, cursor) <= 0 {
			return true // the hub may start below a cursor that caught up past it
		}
		cursor = m.ID
		ev := decode(m)
		if sandboxID != "" && ev.SandboxID != sandboxID {
			return true
		}
		return send(ev)
	}
	failures := 0
	for ctx.Err() == nil {
		// Catch up with plain reads, a page at a time. The Redis client's calls run deep; this
		// goroutine then waits as long as its subscription: each read runs off its stack.
		read := offstack.Run(func() xrange {
			msgs, err := b.rdb.XRangeN(ctx, key, "("+cursor, "+", 200).Result()
			return xrange{msgs, err}
		})
		msgs, err := read.msgs, read.err
		if err != nil {
			failures++
			if failures > 20 || !sleepCtx(ctx, time.Duration(failures)*50*time.Millisecond) {
				return
			}
			continue
		}
		failures = 0
		for _, m := range msgs {
			if !deliver(m) {
				return
			}
		}
		if len(msgs) == 200 || !h.goLive(s, cursor) {
			if len(msgs) == 0 && !sleepCtx(ctx, 10*time.Millisecond) {
				return // the hub has not read the stream's end yet
			}
			continue
		}
		// Live: entries come from the hub, in order, after our cursor.
	live:
		for {
			select {
			case batch := <-s.live:
				for _, m := range batch {
					if !deliver(m) {
						return
					}
				}
			case <-s.fell:
				// Take what the hub queued before it gave up on us, then catch up.
				for {
					select {
					case batch := <-s.live:
						for _, m := range batch {
							if !deliver(m) {
								return
							}
						}
					default:
						break live
					}
				}
			case <-ctx.Done():
				return
			}
		}
	}
}

// xrange is one catch-up read's answer.
type xrange struct {
	msgs []redis.XMessage
	err  error
}

// compareIDs orders two stream entry ids ("ms-seq").
func compareIDs(a, b string) int {
	am, as := splitID(a)
	bm, bs := splitID(b)
	switch {
	case am != bm:
		if am < bm {
			return -1
		}
		return 1
	case as != bs:
		if as < bs {
			return -1
		}
		return 1
	}
	return 0
}

func splitID(id string) (uint64, uint64) {
	ms, seq, _ := strings.Cut(id, "-")
	m, _ := strconv.ParseUint(ms, 10, 64)
	s, _ := strconv.ParseUint(seq, 10, 64)
	return m, s
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
