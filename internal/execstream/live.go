package execstream

import (
	"context"
	"sort"
	"sync"
	"time"
)

// The live feed: subscribers on the replica that follows an exec are fed by that follower
// directly, from memory, and Redis serves replay, catching up and the other replicas.
//
// Append puts a batch's chunks into the exec's feed as it sends them to Redis, not after Redis
// answers (offer), and the exit once Redis has taken it (publish): a command's output reaches
// this replica's subscribers without waiting for the round trip, and the exit event only once
// the stream holds it. The feed is a short window of the newest entries, at the entry ids Redis
// gives them, kept only while a subscriber of this replica watches the exec. A subscriber reads
// Redis until it has caught up, then takes entries from the window; it goes back to Redis
// whenever the window no longer holds what follows its cursor (it fell behind by more than the
// window, or the window was reset), when no follower of this replica feeds the exec (another
// replica follows it, or ours stopped: EndFeed), and after Options.Block without entries (a
// check that nobody else appended). The events it gets are those Redis gives: the same entries,
// decoded by the same code. A subscriber that stops reading holds the window's entries it has
// not passed, never more: the window moves on without it and is bounded per exec and per
// replica.
//
// Chunks offered before Redis took them are still the exec's own bytes at their own offsets:
// every entry is one record of the guest's log, whose records do not move, so the follower
// that copies them after a takeover writes the same entries at the same ids. What a subscriber
// may then hold is a cursor up to one batch (MaxLead) past what Redis holds (this replica died,
// or lost its lease, before the batch was stored): readers take such a cursor of a running exec
// and wait for the entries after it (read.go).

// MaxLead bounds how far past the stored offset Append hands a batch's chunks to this
// replica's subscribers before Redis has taken them: a batch spanning more is fed once stored.
// A reader takes a cursor of a running exec up to MaxLead past the stored offset and waits for
// what follows it. It is above a follower's batch of at most 1 MiB and 256 records (the last
// record up to 64 KiB over, each with its 5-byte header), so an exec's batches are all offered.
const MaxLead = 2 << 20

// Bounds of the live windows.
const (
	// liveExecBytes bounds one exec's window (output bytes), below the stream's own bounds.
	liveExecBytes = 4 << 20
	// liveTotalBytes bounds all windows of a replica together; beyond it, the window being
	// fed drops its oldest entries first.
	liveTotalBytes = 64 << 20
)

// entry is one entry of an exec's stream, as Redis holds it and as a live window holds it.
type entry struct {
	id cursor
	// start is the guest offset where a chunk begins (a hole before it when it is later than
	// the previous entry's end); an exit's is id.off.
	start  int64
	stream Stream
	data   []byte
	exit   *Exit
	end    *End // with exit: what the status records of the end (nil from an older entry)
}

// feeds are the live windows of this replica, one per exec that a local subscriber watches.
type feeds struct {
	// maxBytes and maxLen bound one window: never more than the stream itself keeps, so that
	// the window never gives what Redis would answer with a truncated event.
	maxBytes int64
	maxLen   int

	mu    sync.Mutex
	execs map[string]*feed
	total int64 // output bytes held by all windows
	// followed holds the execs a follower of this replica feeds (BeginFeed to EndFeed), each
	// with the offset where its next batch starts: a window made for a new subscriber is fed
	// from there, so that it waits on the window, not on Redis, for the exec's next output.
	followed map[string]int64
}

func newFeeds(opts Options) *feeds {
	return &feeds{execs: map[string]*feed{}, followed: map[string]int64{}, maxBytes: min(liveExecBytes, opts.MaxBytes), maxLen: int(min(opts.MaxLen, 1<<20))}
}

// feed is one exec's window.
type feed struct {
	fs *feeds
	id string
	// Guarded by fs.mu.
	refs int
	// following: a follower of this replica appended since the window began or was reset, and
	// has not ended (EndFeed).
	following bool
	// base is the guest offset after which the window holds every entry (-1: not known yet);
	// end is the stored offset after the last batch fed.
	base, end int64
	entries   []entry
	bytes     int64
	// changed is closed (and replaced) whenever the window changes.
	changed chan struct{}
}

// watch returns the exec's feed, made when absent; unwatch gives it back.
func (fs *feeds) watch(execID string) *feed {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f := fs.execs[execID]
	if f == nil {
		f = &feed{fs: fs, id: execID, base: -1, end: -1, changed: make(chan struct{})}
		if off, ok := fs.followed[execID]; ok {
			f.following, f.base, f.end = true, off, off
		}
		fs.execs[execID] = f
	}
	f.refs++
	return f
}

func (f *feed) unwatch() {
	fs := f.fs
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f.refs--; f.refs == 0 {
		delete(fs.execs, f.id)
		fs.total -= f.bytes
		f.entries, f.bytes = nil, 0
	}
}

// offer adds chunks that are on their way to Redis (their first one starting at the stored
// offset, or where the window ends); publish adds a batch Redis has just taken: chunks (those
// already offered are skipped) and the exit with its end, when there is one, at stored, the
// offset after the batch.
func (fs *feeds) offer(execID string, chunks []Chunk) {
	fs.add(execID, chunks, nil, nil, -1)
}

func (fs *feeds) publish(execID string, chunks []Chunk, exit *Exit, end *End, stored int64) {
	fs.add(execID, chunks, exit, end, stored)
}

// add puts chunks and the exit into the exec's window; stored < 0 when there is no exit.
func (fs *feeds) add(execID string, chunks []Chunk, exit *Exit, end *End, stored int64) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f := fs.execs[execID]
	if f == nil {
		// No subscriber here: nothing kept, but where the next batch starts.
		if _, ok := fs.followed[execID]; ok && exit == nil && len(chunks) > 0 {
			fs.followed[execID] = chunks[len(chunks)-1].Offset
		}
		return
	}
	if f.following {
		// Skip what the window already holds: chunks offered before Redis took them, or
		// offered again by a retried Append (the same records at the same offsets).
		for len(chunks) > 0 && chunks[0].Offset <= f.end {
			chunks = chunks[1:]
		}
	}
	start := stored
	if len(chunks) > 0 {
		start = chunks[0].Start
	}
	if start < 0 {
		return // nothing new
	}
	if !f.following || f.end != start {
		// The first batch this window sees, or not the one after the last (a batch was not
		// fed: a follower of this replica took over from another): begin again here.
		f.reset(start)
	}
	f.following = true
	for _, c := range chunks {
		if c.Stream != Gap {
			// A gap makes no entry: readers see the hole before the next one.
			f.entries = append(f.entries, entry{id: cursor{off: c.Offset}, start: c.Start, stream: c.Stream, data: c.Data})
			f.bytes += int64(len(c.Data))
			fs.total += int64(len(c.Data))
		}
		f.end = c.Offset
	}
	if exit != nil {
		e := *exit
		f.entries = append(f.entries, entry{id: cursor{off: stored, part: 1}, start: stored, exit: &e, end: end})
		f.end = stored
	}
	for len(f.entries) > 0 && (f.bytes > fs.maxBytes || len(f.entries) > fs.maxLen || fs.total > liveTotalBytes) {
		f.dropOldest()
	}
	if _, ok := fs.followed[execID]; ok {
		fs.followed[execID] = f.end
	}
	f.notify()
}

// reset empties the window, which then holds everything after base.
func (f *feed) reset(base int64) {
	f.fs.total -= f.bytes
	f.entries, f.bytes = nil, 0
	f.base, f.end = base, base
}

// dropOldest drops the oldest entry: the window then holds what follows its end.
func (f *feed) dropOldest() {
	e := f.entries[0]
	f.entries[0] = entry{}
	f.entries = f.entries[1:]
	f.bytes -= int64(len(e.data))
	f.fs.total -= int64(len(e.data))
	f.base = e.id.off
}

func (f *feed) notify() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// end marks the exec as no longer fed here (its follower on this replica stopped); waiting
// subscribers go back to Redis.
func (fs *feeds) end(execID string) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	delete(fs.followed, execID)
	if f := fs.execs[execID]; f != nil && f.following {
		f.following = false
		f.notify()
	}
}

// liveStatus is what a wait on a feed found.
type liveStatus int

const (
	// liveEvents: events follow the cursor (or ctx ended).
	liveEvents liveStatus = iota
	// liveOff: no follower of this replica feeds the exec.
	liveOff
	// liveBehind: the window does not hold what follows the cursor.
	liveBehind
	// liveIdle: nothing came within the wait.
	liveIdle
)

// wait returns up to count events after pos from the window, waiting up to timeout for them.
// done reports that the exit is among them.
func (f *feed) wait(ctx context.Context, pos cursor, count int, timeout time.Duration) (evs []Event, done bool, st liveStatus, err error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		f.fs.mu.Lock()
		// The window holds every entry after its base: what follows pos when pos is not before.
		inWindow := f.base >= 0 && pos.off >= f.base
		if inWindow {
			// The first entry after pos (entries are in id order), also when the follower has
			// just ended (the exit it fed stays until the subscriber takes it).
			i := sort.Search(len(f.entries), func(i int) bool { return f.entries[i].id.after(pos) })
			if i < len(f.entries) {
				batch := f.entries[i:min(len(f.entries), i+count)]
				evs, done, err = events(pos, batch)
				f.fs.mu.Unlock()
				for i := range evs {
					evs[i].Live = true
				}
				return evs, done, liveEvents, err
			}
		}
		switch {
		case !f.following:
			f.fs.mu.Unlock()
			return nil, false, liveOff, nil
		case !inWindow:
			f.fs.mu.Unlock()
			return nil, false, liveBehind, nil
		}
		changed := f.changed
		f.fs.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(timeout)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, false, liveEvents, nil
		case <-timer.C:
			return nil, false, liveIdle, nil
		}
	}
}

// after reports whether c comes after d in the stream.
func (c cursor) after(d cursor) bool {
	return c.off > d.off || c.off == d.off && c.part > d.part
}

// BeginFeed says that a follower of this replica copies the exec from the guest offset offset
// on, with Append: this replica's subscribers wait for its output in the exec's window from
// then on, until EndFeed (which must follow: the mark is kept until then).
func (s *Store) BeginFeed(execID string, offset int64) { s.live.begin(execID, offset) }

func (fs *feeds) begin(execID string, offset int64) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.followed[execID] = offset
	if f := fs.execs[execID]; f != nil && !(f.following && f.end == offset) {
		f.reset(offset)
		f.following = true
		f.notify()
	}
}

// EndFeed says that this replica's follower of the exec stopped (it ended the exec, lost the
// lease, or the replica is closing): its local subscribers go back to Redis.
func (s *Store) EndFeed(execID string) { s.live.end(execID) }
