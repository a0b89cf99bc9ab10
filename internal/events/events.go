// Package events carries sandbox status events through Redis Streams, one bounded stream per
// tenant:project, so that any replica can serve any subscriber and a subscriber that reconnects
// resumes from its cursor (the stream entry id). Each subscriber reads Redis on its own: a slow
// one only falls behind, it never slows the publisher or other subscribers.
package events

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Event is one status event. Fields is a flat map so that producers of other kinds of events
// (exec status, agent runs) can share the stream shape.
type Event struct {
	// Cursor is the stream entry id; pass it back as `after` to resume after this event.
	Cursor    string
	Type      string
	SandboxID string
	Fields    map[string]string
	At        time.Time
}

// Bus publishes and follows events.
type Bus struct {
	rdb redis.UniversalClient
	// blocking serves the subscribers' blocking reads, so that they never hold the
	// connections everything else needs.
	blocking redis.UniversalClient
	// MaxLen bounds each project's stream (approximately, on a real Redis).
	maxLen int64
	// block is how long one XREAD waits before checking the context again.
	block time.Duration
	// slots bounds the subscriptions this replica follows at once.
	slots chan struct{}

	hubMu sync.Mutex
	hubs  map[string]*hub // by stream key: one reader per project stream with subscribers
}

// Options configure a Bus.
type Options struct {
	// MaxLen bounds each project's stream (default 10,000 events).
	MaxLen int64
	// Blocking is the client for the blocking reads: one per project stream that has
	// subscribers on this replica. Default: the Bus's own client.
	Blocking redis.UniversalClient
	// MaxSubscribers bounds concurrent subscriptions (default 1,000); beyond it Subscribe
	// answers ErrTooManySubscribers.
	MaxSubscribers int
}

// ErrTooManySubscribers means this replica follows as many subscriptions as it may.
var ErrTooManySubscribers = errors.New("events: too many subscriptions on this replica")

// New returns a Bus.
func New(rdb redis.UniversalClient, opts Options) *Bus {
	if opts.MaxLen <= 0 {
		opts.MaxLen = 10000
	}
	if opts.Blocking == nil {
		opts.Blocking = rdb
	}
	if opts.MaxSubscribers <= 0 {
		opts.MaxSubscribers = 1000
	}
	return &Bus{rdb: rdb, blocking: opts.Blocking, maxLen: opts.MaxLen, block: 5 * time.Second,
		slots: make(chan struct{}, opts.MaxSubscribers), hubs: map[string]*hub{}}
}

func streamKey(tenant, project string) string { return "sbx:{" + tenant + ":" + project + "}:events" }

// ErrBadCursor is returned for a malformed `after` cursor.
var ErrBadCursor = errors.New("events: malformed cursor")

var cursorPattern = regexp.MustCompile(`^[0-9]{1,20}-[0-9]{1,20}$`)

// ValidCursor reports whether s is a usable cursor ("" means "from now").
func ValidCursor(s string) bool { return s == "" || cursorPattern.MatchString(s) }

// Publish appends an event to the project's stream and returns its cursor.
func (b *Bus) Publish(ctx context.Context, tenant, project string, ev Event) (string, error) {
	values := map[string]any{"type": ev.Type, "sandbox_id": ev.SandboxID, "at": ev.At.UTC().Format(time.RFC3339Nano)}
	for k, v := range ev.Fields {
		values["f."+k] = v
	}
	id, err := b.rdb.XAdd(ctx, &redis.XAddArgs{
		Stream: streamKey(tenant, project), MaxLen: b.maxLen, Approx: true, Values: values,
	}).Result()
	if err != nil {
		return "", fmt.Errorf("events publish: %w", err)
	}
	return id, nil
}

// Subscribe follows the project's events after the cursor after ("" = only new events),
// keeping those of sandboxID ("" = all of the project). The channel is closed when ctx ends or
// Redis fails for good; each send waits on ctx, so an abandoned subscriber leaks nothing.
func (b *Bus) Subscribe(ctx context.Context, tenant, project, sandboxID, after string) (<-chan Event, error) {
	out := make(chan Event, 16)
	err := b.SubscribeFunc(ctx, tenant, project, sandboxID, after, func(ev Event) bool {
		select {
		case out <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}, func() { close(out) })
	if err != nil {
		return nil, err
	}
	return out, nil
}

// SubscribeFunc is Subscribe with each event handed to deliver, in order, on the one goroutine
// that follows the stream: a caller that converts events needs no goroutine of its own. The
// follow ends when deliver returns false, when ctx ends or when Redis fails for good; then
// done runs (nil: nothing). deliver must not block past ctx. On an error neither runs.
func (b *Bus) SubscribeFunc(ctx context.Context, tenant, project, sandboxID, after string, deliver func(Event) bool, done func()) error {
	if !ValidCursor(after) {
		return ErrBadCursor
	}
	select {
	case b.slots <- struct{}{}:
	default:
		return ErrTooManySubscribers
	}
	key := streamKey(tenant, project)
	if after == "" {
		// Start from the current last entry, so nothing published after Subscribe returns is missed.
		last, err := b.rdb.XRevRangeN(ctx, key, "+", "-", 1).Result()
		if err != nil {
			<-b.slots
			return fmt.Errorf("events subscribe: %w", err)
		}
		after = "0-0"
		if len(last) == 1 {
			after = last[0].ID
		}
	}
	go func() {
		defer func() { <-b.slots }()
		if done != nil {
			defer done()
		}
		b.follow(ctx, key, sandboxID, after, deliver)
	}()
	return nil
}

// LastCursor is the cursor of the newest event of the project's stream, "0-0" when it has
// none: a subscription after it gets every event published after this call.
func (b *Bus) LastCursor(ctx context.Context, tenant, project string) (string, error) {
	last, err := b.rdb.XRevRangeN(ctx, streamKey(tenant, project), "+", "-", 1).Result()
	if err != nil {
		return "", fmt.Errorf("events last cursor: %w", err)
	}
	if len(last) == 1 {
		return last[0].ID, nil
	}
	return "0-0", nil
}

func decode(m redis.XMessage) Event {
	ev := Event{Cursor: m.ID, Fields: map[string]string{}}
	for k, v := range m.Values {
		s, _ := v.(string)
		switch {
		case k == "type":
			ev.Type = s
		case k == "sandbox_id":
			ev.SandboxID = s
		case k == "at":
			ev.At, _ = time.Parse(time.RFC3339Nano, s)
		case strings.HasPrefix(k, "f."):
			ev.Fields[k[2:]] = s
		}
	}
	return ev
}
