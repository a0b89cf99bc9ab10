package server

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/guest/proto"
)

// Watches (proto/files.go): one inotify instance per watch, read by one goroutine (its loop,
// watchloop.go) that turns the kernel's events into the watch's events and keeps them in a
// bounded ring with sequence numbers. Readers (GET …/events, up to MaxWatchReaders at once,
// from any replica) replay the ring after their sequence and follow it; the watch lives on for
// its grace period after the last reader left, so that a reader that reconnects resumes
// without a gap. A reader older than the ring gets an
// EventOverflow (ReasonRing) with what it missed; a kernel queue overflow is one in the ring.
//
// Directories are watched through /proc/self/fd/N of a descriptor reached by walkDir (no link
// followed), so a command that swaps a directory for a symlink cannot get a directory outside
// the workspace watched. Paths in events are relative to the workspace; the server's own names
// (temp files, trash and staging folders) are never reported: a rename into one is a deletion,
// out of one a creation.

// watchMask is what every watched directory reports.
const watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_ATTRIB |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

// moveWait is how long a rename's first half (IN_MOVED_FROM) waits for its second: without it
// the entry left the watched tree (a deletion).
const moveWait = 20 * time.Millisecond

// maxPendingMods bounds the files whose modifications are being coalesced at once; beyond it
// a modification is reported at once.
const maxPendingMods = 4096

// watchSet is the server's watches by id.
type watchSet struct {
	s *Server

	mu     sync.Mutex
	m      map[string]*watch
	closed bool
}

func newWatchSet(s *Server) *watchSet { return &watchSet{s: s, m: map[string]*watch{}} }

func (ws *watchSet) get(id string) *watch {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.m[id]
}

// remove forgets w (when it is still the set's) and closes it.
func (ws *watchSet) remove(w *watch) {
	ws.mu.Lock()
	if ws.m[w.id] == w {
		delete(ws.m, w.id)
	}
	ws.mu.Unlock()
	w.close()
}

// closeAll closes every watch (the server is closing).
func (ws *watchSet) closeAll() {
	ws.mu.Lock()
	ws.closed = true
	all := ws.m
	ws.m = map[string]*watch{}
	ws.mu.Unlock()
	for _, w := range all {
		w.close()
	}
}

// watch is one inotify watch of a directory (and its tree when recursive).
type watch struct {
	id        string
	set       *watchSet
	rel       string // the watched directory as the client named it (cleaned)
	root      string // the watched directory, resolved
	recursive bool
	maxDirs   int
	maxEvents int
	grace     time.Duration
	in        *os.File // the inotify instance (non-blocking, on the runtime's poller)
	fd        int      // in's descriptor (never in.Fd(), which would make it blocking)
	ctx       context.Context
	cancel    context.CancelFunc
	done      chan struct{} // closed when the loop ended
	closeOnce sync.Once

	// The loop's own state (only the loop and, before it starts, create touch it).
	dirs    map[int]string // watch descriptor → directory, relative to the workspace
	wds     map[string]int
	rootWD  int
	pending *rawEvent // an IN_MOVED_FROM waiting for its IN_MOVED_TO
	pendAt  time.Time
	mods    map[string]*modState

	// The ring and its readers.
	mu      sync.Mutex
	events  []proto.WatchEvent // seq first … next-1
	bytes   int
	first   uint64
	next    uint64
	notify  chan struct{} // closed and replaced at every append
	ended   bool
	readers int
	expiry  *time.Timer
}

type modState struct {
	at    time.Time
	dirty bool
}

// rawEvent is one inotify event.
type rawEvent struct {
	wd     int
	mask   uint32
	cookie uint32
	name   string
}

func (s *Server) handleCreateWatch(w http.ResponseWriter, r *http.Request) {
	var req proto.WatchRequest
	if perr := readJSON(r, &req, 64<<10); perr != nil {
		writeError(w, perr)
		return
	}
	_, info, perr := s.watches.create(req)
	if perr != nil {
		writeError(w, perr)
		return
	}
	writeJSON(w, http.StatusCreated, info)
}

func (s *Server) handleDeleteWatch(w http.ResponseWriter, r *http.Request) {
	wt := s.watches.get(r.PathValue("id"))
	if wt == nil {
		writeError(w, errorf(proto.ErrCodeGone, "no watch %s", r.PathValue("id")))
		return
	}
	wt.end(proto.ErrCodeGone, "the watch was deleted")
	s.watches.remove(wt)
	w.WriteHeader(http.StatusNoContent)
}

// create checks the request, watches the directory (its tree) and starts the loop.
func (ws *watchSet) create(req proto.WatchRequest) (*watch, proto.WatchInfo, *proto.Error) {
	s := ws.s
	rel, perr := s.relPath(req.Path, true)
	if perr != nil {
		return nil, proto.WatchInfo{}, perr
	}
	maxDirs, maxEvents, grace := req.MaxDirs, req.MaxEvents, time.Duration(req.GraceMs)*time.Millisecond
	switch {
	case maxDirs < 0 || maxDirs > proto.MaxWatchDirs:
		return nil, proto.WatchInfo{}, errorf(proto.ErrCodeInvalid, "max_dirs must be 0 to %d", proto.MaxWatchDirs)
	case maxEvents < 0 || maxEvents > proto.MaxWatchEvents:
		return nil, proto.WatchInfo{}, errorf(proto.ErrCodeInvalid, "max_events must be 0 to %d", proto.MaxWatchEvents)
	case grace < 0 || grace > proto.MaxWatchGrace:
		return nil, proto.WatchInfo{}, errorf(proto.ErrCodeInvalid, "grace_ms must be 0 to %d", proto.MaxWatchGrace.Milliseconds())
	}
	if maxDirs == 0 {
		maxDirs = proto.DefaultWatchDirs
	}
	if maxEvents == 0 {
		maxEvents = proto.DefaultWatchEvents
	}
	if grace == 0 {
		grace = proto.DefaultWatchGrace
	}
	if !req.Recursive {
		maxDirs = 1
	}
	limit := proto.MaxWatches
	if req.MaxWatches > 0 && req.MaxWatches < limit {
		limit = req.MaxWatches
	}
	ws.mu.Lock()
	full := len(ws.m) >= limit
	closed := ws.closed
	ws.mu.Unlock()
	if closed {
		return nil, proto.WatchInfo{}, errShuttingDown()
	}
	if full {
		return nil, proto.WatchInfo{}, errorf(proto.ErrCodeTooMany, "%d watches exist in this sandbox, the most allowed", limit)
	}
	res, perr := s.resolveDir(rel, rel)
	if perr != nil {
		return nil, proto.WatchInfo{}, perr
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, proto.WatchInfo{}, errorf(proto.ErrCodeUnavailable, "inotify: %v", err)
	}
	ctx, cancel := context.WithCancel(s.ctx)
	w := &watch{id: randName("w"), fd: fd, set: ws, rel: rel, root: res, recursive: req.Recursive, maxDirs: maxDirs,
		maxEvents: maxEvents, grace: grace, in: os.NewFile(uintptr(fd), "inotify"), ctx: ctx, cancel: cancel,
		done: make(chan struct{}), dirs: map[int]string{}, wds: map[string]int{}, mods: map[string]*modState{},
		first: 1, next: 1, notify: make(chan struct{})}
	if err := w.addTree(res, false, true); err != nil {
		cancel()
		_ = w.in.Close()
		return nil, proto.WatchInfo{}, err
	}
	w.rootWD = w.wds[res]
	ws.mu.Lock()
	if ws.closed || len(ws.m) >= limit {
		ws.mu.Unlock()
		cancel()
		_ = w.in.Close()
		return nil, proto.WatchInfo{}, errorf(proto.ErrCodeTooMany, "%d watches exist in this sandbox, the most allowed", limit)
	}
	ws.m[w.id] = w
	ws.mu.Unlock()
	// Before the loop starts: from then on only the loop touches the directories.
	info := proto.WatchInfo{ID: w.id, Path: w.root, Recursive: w.recursive, Dirs: len(w.dirs), Seq: 0}
	w.mu.Lock()
	w.expiry = time.AfterFunc(w.grace, w.expire)
	w.mu.Unlock()
	startWatchLoop(w)
	return w, info, nil
}

// startWatchLoop starts a new watch's loop (a test delays it to overflow the kernel's queue).
var startWatchLoop = func(w *watch) { go w.loop() }

// close stops the loop and frees the inotify instance; readers end.
func (w *watch) close() {
	w.closeOnce.Do(func() {
		w.cancel()
		_ = w.in.SetReadDeadline(time.Now()) // wakes the loop
		<-w.done
		w.mu.Lock()
		if w.expiry != nil {
			w.expiry.Stop()
		}
		w.mu.Unlock()
	})
}

// expire removes the watch unless a reader came back.
func (w *watch) expire() {
	w.mu.Lock()
	idle := w.readers == 0
	w.mu.Unlock()
	if idle {
		w.set.remove(w)
	}
}

// ---- the ring ----

// emit appends an event (the loop calls it).
func (w *watch) emit(ev proto.WatchEvent) {
	if ev.At.IsZero() {
		ev.At = time.Now().UTC()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return
	}
	ev.Seq = w.next
	w.next++
	w.events = append(w.events, ev)
	w.bytes += eventBytes(ev)
	for len(w.events) > w.maxEvents || (w.bytes > proto.MaxWatchEventBytes && len(w.events) > 1) {
		w.bytes -= eventBytes(w.events[0])
		w.events[0] = proto.WatchEvent{} // its strings go with it
		w.events = w.events[1:]
		w.first++
	}
	if cap(w.events) > 2*w.maxEvents+64 {
		// The slice crept forward through its array: copy the kept events to a new one
		// (amortized: once per maxEvents evictions).
		w.events = append(make([]proto.WatchEvent, 0, w.maxEvents+64), w.events...)
	}
	if ev.Kind == proto.EventEnd {
		w.ended = true
	}
	close(w.notify)
	w.notify = make(chan struct{})
}

func eventBytes(ev proto.WatchEvent) int { return 64 + len(ev.Path) + len(ev.From) + len(ev.Message) }

// end appends the end event: the watch reports nothing after it.
func (w *watch) end(code, msg string) {
	w.emit(proto.WatchEvent{Kind: proto.EventEnd, Code: code, Message: msg})
}

// read returns the events after seq (at most max), preceded by an EventOverflow when seq is
// older than the ring keeps; done is true when the end event was among them or seq is at or
// after it; notify is closed at the next append.
func (w *watch) read(after uint64, max int) (evs []proto.WatchEvent, done bool, notify <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if after+1 < w.first {
		evs = append(evs, proto.WatchEvent{Seq: w.first - 1, Kind: proto.EventOverflow, Reason: proto.ReasonRing,
			Missed: int64(w.first - 1 - after), At: time.Now().UTC()})
		after = w.first - 1
	}
	for i := int(after + 1 - w.first); i < len(w.events) && len(evs) < max; i++ {
		evs = append(evs, w.events[i])
		if w.events[i].Kind == proto.EventEnd {
			return evs, true, w.notify
		}
	}
	if w.ended && len(evs) == 0 {
		// The reader saw the end already: answer it again.
		evs = append(evs, w.events[len(w.events)-1])
		return evs, true, w.notify
	}
	return evs, false, w.notify
}

// addReader counts a reader (false when the watch has MaxWatchReaders already).
func (w *watch) addReader() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.readers >= proto.MaxWatchReaders {
		return false
	}
	w.readers++
	if w.expiry != nil {
		w.expiry.Stop()
	}
	return true
}

func (w *watch) removeReader() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.readers--
	if w.readers == 0 && w.expiry != nil {
		w.expiry.Reset(w.grace)
	}
}

func (s *Server) handleWatchEvents(w http.ResponseWriter, r *http.Request) {
	wt := s.watches.get(r.PathValue("id"))
	if wt == nil {
		writeError(w, errorf(proto.ErrCodeGone, "no watch %s (it expired, or the sandbox restarted)", r.PathValue("id")))
		return
	}
	q := r.URL.Query()
	if q.Has("path") {
		rel, perr := s.relPath(q.Get("path"), true)
		if perr != nil {
			writeError(w, perr)
			return
		}
		if rel != wt.rel || isTrue(q.Get("recursive")) != wt.recursive {
			writeError(w, errorf(proto.ErrCodeInvalid, "the cursor belongs to a watch of %s (recursive %v), not of %s (recursive %v)",
				absName(wt.rel), wt.recursive, absName(rel), isTrue(q.Get("recursive"))))
			return
		}
	}
	var after uint64
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeError(w, errorf(proto.ErrCodeInvalid, "bad after %q", v))
			return
		}
		after = n
	}
	wt.mu.Lock()
	newest := wt.next - 1
	wt.mu.Unlock()
	if after > newest {
		writeError(w, errorf(proto.ErrCodeInvalid, "after %d is beyond the watch's newest event %d", after, newest))
		return
	}
	if !wt.addReader() {
		writeError(w, errorf(proto.ErrCodeTooMany, "watch %s has %d readers, the most allowed", wt.id, proto.MaxWatchReaders))
		return
	}
	defer wt.removeReader()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	enc := json.NewEncoder(w)
	for {
		evs, done, notify := wt.read(after, 256)
		for _, ev := range evs {
			if err := enc.Encode(ev); err != nil {
				return
			}
			after = ev.Seq
		}
		if len(evs) > 0 && rc.Flush() != nil {
			return
		}
		if done {
			return
		}
		if len(evs) > 0 {
			continue
		}
		select {
		case <-notify:
		case <-r.Context().Done():
			return
		case <-wt.ctx.Done():
			// Closed (expired, deleted, server closing): a reader that was still here gets what
			// was appended meanwhile; a watch closed without an end event just breaks off.
			evs, _, _ := wt.read(after, 256)
			for _, ev := range evs {
				_ = enc.Encode(ev)
			}
			_ = rc.Flush()
			return
		}
	}
}
