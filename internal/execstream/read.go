package execstream

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"sandboxd/internal/apierror"
)

// EventKind says what an Event carries.
type EventKind string

// The event kinds.
const (
	// EventChunk carries output: Stream and Data.
	EventChunk EventKind = "chunk"
	// EventExit carries the exit status; it is always the last event of an exec.
	EventExit EventKind = "exit"
	// EventTruncated says that output between the previous cursor and this event's Cursor is no
	// longer in the bounded stream (trimmed, the exec was swept, or the guest's bounded log
	// dropped it before it was copied: a Gap): Missed guest log bytes.
	EventTruncated EventKind = "truncated"
)

// Event is one event of an exec's output.
type Event struct {
	Kind EventKind
	// Cursor is the position after this event; pass it back as `after` to resume there.
	Cursor string
	Stream Stream
	Data   []byte
	Exit   *Exit
	// End comes with an exit event: what the exec's status records of its end, from the
	// exit entry itself (nil for an entry an older version wrote, which does not carry it).
	End *End
	// Missed is, for EventTruncated, how many guest log bytes (output plus 5-byte record
	// headers) were lost; 0 when unknown (the exec itself is gone).
	Missed int64
	// Live: a subscription took the event from this replica's live window, not from Redis.
	Live bool
}

// End is what an exec's status (Meta) records of its end besides the exit status: when it
// ended and the output bytes its stream took in all. Its exit entry carries them, so that
// a subscriber's exit event is complete without a read of the status.
type End struct {
	At    time.Time
	Bytes int64
}

// cursor is a position in an exec's stream: the entry id "<guest offset>-<part>", part 0 after
// the chunk that ends at that offset (or at the start, "0-0"), part 1 after the exit entry.
type cursor struct {
	off  int64
	part int64
}

var cursorPattern = regexp.MustCompile(`^[0-9]{1,19}-[0-9]{1,19}$`)

func parseCursor(s string) (cursor, error) {
	if s == "" {
		return cursor{}, nil
	}
	if !cursorPattern.MatchString(s) {
		return cursor{}, ErrBadCursor
	}
	a, b, _ := strings.Cut(s, "-")
	off, err1 := strconv.ParseInt(a, 10, 64)
	part, err2 := strconv.ParseInt(b, 10, 64)
	if err1 != nil || err2 != nil || part > 1 {
		return cursor{}, ErrBadCursor
	}
	return cursor{off: off, part: part}, nil
}

func (c cursor) String() string {
	return strconv.FormatInt(c.off, 10) + "-" + strconv.FormatInt(c.part, 10)
}

// Read returns up to count events after the cursor after ("" = from the start of the exec's
// output; count <= 0 means 100). When nothing follows the cursor yet and block > 0, it waits up
// to block for more (an empty result means nothing came). A truncated event comes first when
// output after the cursor has been trimmed, so a result may hold count+1 events. A cursor at the
// exit event gives an empty result at once. ErrBadCursor for a malformed cursor or one this
// exec never gave; ErrNotFound for an unknown (or swept) exec.
func (s *Store) Read(ctx context.Context, execID, after string, count int, block time.Duration) ([]Event, error) {
	evs, _, err := s.read(ctx, execID, after, count, block, nil)
	return evs, err
}

// ReadFirst returns the exec's status and the first events of its output (up to count, as
// Read from the start), read in one round trip. ErrNotFound for an unknown (or swept) exec.
func (s *Store) ReadFirst(ctx context.Context, execID string, count int) (Meta, []Event, error) {
	var m Meta
	evs, _, err := s.read(ctx, execID, "", count, 0, &m)
	return m, evs, err
}

// read is Read that also reports whether nothing can ever follow the events returned (the exit
// event is among them, or the cursor was already at it). With meta not nil it also reads the
// exec's whole status into *meta, in the same round trip (and for a malformed cursor, alone,
// before ErrBadCursor): *meta is set whenever the exec exists.
func (s *Store) read(ctx context.Context, execID, after string, count int, block time.Duration, meta *Meta) ([]Event, bool, error) {
	if !validID(execID) {
		return nil, false, fmt.Errorf("execstream read %q: %w", execID, ErrNotFound)
	}
	pos, err := parseCursor(after)
	if err != nil {
		if meta != nil {
			if *meta, err = s.Get(ctx, execID); err != nil {
				return nil, false, err
			}
		}
		return nil, false, fmt.Errorf("execstream read %s: cursor %q: %w", execID, after, ErrBadCursor)
	}
	if count <= 0 {
		count = 100
	}
	var hm *redis.SliceCmd
	var ha *redis.MapStringStringCmd
	var xr *redis.XMessageSliceCmd
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		if meta != nil {
			ha = p.HGetAll(ctx, metaKey(execID))
		} else {
			hm = p.HMGet(ctx, metaKey(execID), "state", "offset")
		}
		xr = p.XRangeN(ctx, outKey(execID), cursor{pos.off, pos.part + 1}.String(), "+", int64(count))
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("execstream read %s: %w", execID, err)
	}
	var state State
	var stored int64
	if meta != nil {
		m, ok := parseMeta(execID, ha.Val())
		if !ok {
			return nil, false, fmt.Errorf("execstream read %s: %w", execID, ErrNotFound)
		}
		*meta, state, stored = m, m.State, m.Offset
	} else {
		vals := hm.Val()
		st, _ := vals[0].(string)
		if st == "" {
			return nil, false, fmt.Errorf("execstream read %s: %w", execID, ErrNotFound)
		}
		offStr, _ := vals[1].(string)
		state = State(st)
		stored, _ = strconv.ParseInt(offStr, 10, 64)
	}
	ended := state == Ended
	// The last entry id is "<stored>-1" once ended, else "<stored>-0" (or nothing yet). A
	// cursor past it was never given out, and waiting for it could hang; but for the one batch
	// that a follower's replica hands its own subscribers while Redis takes it (MaxLead), whose
	// entries come with the exec's next Append (from whichever replica follows it then) or
	// never, when it ends first: then the cursor is refused.
	if pos.off > stored && (ended || pos.off-stored > MaxLead) || pos.part == 1 && (!ended || pos.off != stored) {
		return nil, false, fmt.Errorf("execstream read %s: cursor %q is past the end: %w", execID, after, ErrBadCursor)
	}
	msgs := xr.Val()
	if len(msgs) == 0 {
		// The newest entry is never trimmed, so an ended exec with nothing after the cursor means
		// the cursor is at the exit event.
		if ended || block <= 0 {
			return nil, ended, nil
		}
		res, err := s.block.XRead(ctx, &redis.XReadArgs{
			Streams: []string{outKey(execID), pos.String()}, Count: int64(count), Block: max(block, time.Millisecond),
		}).Result()
		if errors.Is(err, redis.Nil) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("execstream read %s: %w", execID, err)
		}
		if len(res) == 1 {
			msgs = res[0].Messages
		}
	}
	evs, done, err := decode(pos, msgs)
	if err != nil {
		return nil, false, fmt.Errorf("execstream read %s: cursor %q: %w", execID, after, err)
	}
	return evs, done, nil
}

// decode turns stream entries after pos into events, with a truncated event wherever an entry
// does not start where the previous one (or the cursor) ended.
func decode(pos cursor, msgs []redis.XMessage) ([]Event, bool, error) {
	entries := make([]entry, 0, len(msgs))
	for _, m := range msgs {
		id, err := parseCursor(m.ID)
		if err != nil {
			return nil, false, fmt.Errorf("stream entry id %q: %w", m.ID, err)
		}
		str := func(k string) string { v, _ := m.Values[k].(string); return v }
		e := entry{id: id, start: id.off}
		if id.part == 1 {
			code, _ := strconv.Atoi(str("code"))
			dur, _ := strconv.ParseInt(str("duration_ms"), 10, 64)
			dropped, _ := strconv.ParseInt(str("dropped"), 10, 64)
			stdoutBytes, _ := strconv.ParseInt(str("stdout_bytes"), 10, 64)
			stderrBytes, _ := strconv.ParseInt(str("stderr_bytes"), 10, 64)
			e.exit = &Exit{ExitCode: code, Signal: str("signal"), TimedOut: str("timed_out") == "1", DurationMs: dur,
				Error: str("error"), Dropped: dropped, StdoutBytes: stdoutBytes, StderrBytes: stderrBytes}
			if at := fromMs(str("ended_at")); !at.IsZero() {
				bytes, _ := strconv.ParseInt(str("bytes"), 10, 64)
				e.end = &End{At: at, Bytes: bytes}
			}
		} else {
			e.start, err = strconv.ParseInt(str("start"), 10, 64)
			if err != nil {
				return nil, false, fmt.Errorf("stream entry %s: bad start %q", m.ID, str("start"))
			}
			e.stream, e.data = Stream(str("stream")), []byte(str("data"))
		}
		entries = append(entries, e)
	}
	return events(pos, entries)
}

// events turns entries after pos into events, with a truncated event wherever an entry does
// not start where the previous one (or the cursor) ended. Redis's entries and the live
// window's go through it alike. Chunk events share the entries' data.
func events(pos cursor, entries []entry) ([]Event, bool, error) {
	evs := make([]Event, 0, len(entries)+1)
	expect := pos.off
	for _, e := range entries {
		switch {
		case e.start < expect:
			// Only a cursor that is not an entry boundary of this exec gets here.
			return nil, false, ErrBadCursor
		case e.start > expect:
			evs = append(evs, Event{Kind: EventTruncated, Cursor: cursor{off: e.start}.String(), Missed: e.start - expect})
		}
		if e.exit != nil {
			if e.exit.Dropped > 0 {
				// An older guest's bounded log could not keep the end of the output: say so
				// before the exit, at the cursor just before it (a resume there sees both again).
				evs = append(evs, Event{Kind: EventTruncated, Cursor: cursor{off: e.start}.String(), Missed: e.exit.Dropped})
			}
			x := *e.exit
			ev := Event{Kind: EventExit, Cursor: e.id.String(), Exit: &x}
			if e.end != nil {
				end := *e.end
				ev.End = &end
			}
			evs = append(evs, ev)
			return evs, true, nil
		}
		evs = append(evs, Event{Kind: EventChunk, Cursor: e.id.String(), Stream: e.stream, Data: e.data})
		expect = e.id.off
	}
	return evs, false, nil
}

// Subscribe replays an exec's output after the cursor after ("" = from the start) and then
// follows it live, from any replica. The channel carries chunk events in order, a truncated
// event wherever output was trimmed before this subscriber read it, and finally the exit event,
// after which it is closed. It is also closed when ctx ends, or when Redis keeps failing
// (the caller resumes from its last cursor). Each subscriber reads on its own and each send
// waits on ctx: a slow subscriber only falls behind (and may then see a truncated event), it
// never slows Append or other subscribers, and an abandoned one leaks nothing. Once caught up,
// a subscriber on the replica that follows the exec takes the follower's batches from memory
// (live.go) instead of reading them back from Redis. Chunk events' Data must not be modified:
// subscribers may share it. ErrBadCursor and ErrNotFound are returned at once.
func (s *Store) Subscribe(ctx context.Context, execID, after string) (<-chan Event, error) {
	return s.SubscribeAs(ctx, execID, after, nil)
}

// SubscribeAs is Subscribe for a caller that must see the exec's status first (whose exec it
// is, where it stands): the first read of the output brings it in the same round trip, and
// check (when not nil) gets it before anything else happens. An error from check is returned
// instead of the subscription, and before a cursor is judged, so that a caller who may not
// see the exec learns nothing of it from a bad cursor either.
func (s *Store) SubscribeAs(ctx context.Context, execID, after string, check func(Meta) error) (<-chan Event, error) {
	batch := s.opts.Buffer
	// Watch before the first read: every batch appended from here on is either in what Redis
	// answers or in the window.
	live := s.live.watch(execID)
	var meta *Meta
	if check != nil {
		meta = &Meta{}
	}
	first, done, err := s.read(ctx, execID, after, batch, 0, meta)
	if meta != nil && meta.ID != "" {
		if cerr := check(*meta); cerr != nil {
			err = cerr
		}
	}
	if err != nil {
		live.unwatch()
		return nil, err
	}
	pos, _ := parseCursor(after) // checked by read
	out := make(chan Event, s.opts.Buffer)
	go func() {
		defer close(out)
		defer live.unwatch()
		evs := first
		failures := 0
		redisAhead := false
		for {
			for _, ev := range evs {
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
				pos, _ = parseCursor(ev.Cursor)
			}
			if done || ctx.Err() != nil {
				return
			}
			// Caught up with what was read: the window, while this replica's follower feeds it
			// (unless Redis was found ahead of it: another replica appends).
			block := s.opts.Block
			st := liveOff
			var err error
			if !redisAhead {
				if evs, done, st, err = live.wait(ctx, pos, batch, s.opts.Block); err == nil && st == liveEvents {
					continue
				}
				if st == liveIdle {
					block = 0 // the window was quiet: only check that nobody else appended
				}
			}
			evs, done, err = s.read(ctx, execID, pos.String(), batch, block, nil)
			if err == nil {
				failures = 0
				// New entries after a quiet window: read Redis while it has more; an empty
				// read (nothing within Block) sends this subscriber back to the window.
				redisAhead = (st == liveIdle || redisAhead) && (len(evs) > 0 || done)
				continue
			}
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, ErrNotFound) {
				// Swept (or lost) while this subscriber was behind: the rest is gone.
				select {
				case out <- Event{Kind: EventTruncated, Cursor: pos.String()}:
				case <-ctx.Done():
				}
				return
			}
			var coded *apierror.Error
			if failures++; failures > 20 || errors.As(err, &coded) {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(failures) * 50 * time.Millisecond):
			}
		}
	}()
	return out, nil
}
