package server

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/guest/proto"
)

// Watches (proto/files.go): one inotify instance per watch, read by one goroutine that turns
// the kernel's events into the watch's events and keeps them in a bounded ring with sequence
// numbers. Readers (GET …/events, any number, from any replica) replay the ring after their
// sequence and follow it; the watch lives on for its grace period after the last reader left,
// so that a reader that reconnects resumes without a gap. A reader older than the ring gets an
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
		return nil, proto.WatchInfo{}, errorf(proto.ErrCodeUnavailable, "the guest init is shutting down")
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

// ---- the tree ----

// addTree watches dir and, when the watch is recursive, the directories below it. With scan
// every entry found is reported as created (a directory made under a recursive watch: what
// it held before its watch was added), at most WatchScanEntries of them (then ReasonScan).
// With initial, a tree over maxDirs is an error; otherwise the directories beyond it are not
// watched, and an EventOverflow (ReasonDirs) names the first one in each folder. Directories
// are listed in batches, never held whole, whatever they hold.
func (w *watch) addTree(dir string, scan, initial bool) *proto.Error {
	root, err := w.set.s.openRootFD()
	if err != nil {
		return fsError(err)
	}
	defer root.close()
	queue := []string{dir}
	reported := 0
	tooMany := func() *proto.Error {
		return errorf(proto.ErrCodeTooLarge, "%s holds more than %d directories, the most one watch may hold: watch a smaller folder, or not recursively",
			absName(w.rel), w.maxDirs)
	}
	for len(queue) > 0 {
		d := queue[0]
		queue = queue[1:]
		if _, ok := w.wds[d]; ok {
			continue
		}
		if len(w.dirs) >= w.maxDirs {
			if initial {
				return tooMany()
			}
			w.emit(proto.WatchEvent{Kind: proto.EventOverflow, Reason: proto.ReasonDirs, Path: d, IsDir: true})
			continue
		}
		fd, err := walkDir(root, d)
		if err != nil {
			if initial && d == dir {
				return fsError(err)
			}
			continue // gone or replaced meanwhile: its parent reports what happened
		}
		wd, err := unix.InotifyAddWatch(w.fd, "/proc/self/fd/"+strconv.Itoa(int(fd)), watchMask)
		if err != nil {
			fd.close()
			if initial && d == dir {
				return errorf(proto.ErrCodeUnavailable, "inotify_add_watch %s: %v", absName(d), err)
			}
			continue
		}
		w.dirs[wd] = d
		w.wds[d] = wd
		if !w.recursive && !scan {
			fd.close()
			continue
		}
		over, full := false, false
		err = eachDirEntry(fd, path.Join(w.set.s.ws, d), func(e fs.DirEntry) bool {
			p := path.Join(d, e.Name())
			if ownNameIn(p) != "" {
				return true
			}
			isDir := e.Type()&fs.ModeDir != 0
			if scan {
				switch {
				case reported < proto.WatchScanEntries:
					w.emit(proto.WatchEvent{Kind: proto.EventCreated, Path: p, IsDir: isDir})
				case reported == proto.WatchScanEntries:
					w.emit(proto.WatchEvent{Kind: proto.EventOverflow, Reason: proto.ReasonScan, Path: dir, IsDir: true})
				}
				reported++
			}
			if isDir && w.recursive {
				if len(w.dirs)+len(queue) >= w.maxDirs {
					if initial {
						full = true
						return false
					}
					if !over {
						over = true
						w.emit(proto.WatchEvent{Kind: proto.EventOverflow, Reason: proto.ReasonDirs, Path: p, IsDir: true})
					}
				} else {
					queue = append(queue, p)
				}
			}
			return true
		})
		fd.close()
		if full {
			return tooMany()
		}
		_ = err // a folder that went away meanwhile: its parent reports what happened
	}
	return nil
}

// eachDirEntry calls f with each entry of a directory, its type from the directory itself
// (name is the directory's path, used only when the file system does not tell a type), in
// batches, until f answers false.
func eachDirEntry(dir dirFD, name string, f func(fs.DirEntry) bool) error {
	fd, err := retryEINTR(func() (int, error) {
		return unix.Openat(int(dir), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	})
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(fd), name)
	defer d.Close()
	for {
		batch, err := d.ReadDir(1024)
		for _, e := range batch {
			if !f(e) {
				return nil
			}
		}
		if err != nil || len(batch) == 0 {
			return nil
		}
	}
}

// forget stops watching dir and everything below it.
func (w *watch) forget(dir string) {
	for p, wd := range w.wds {
		if p == dir || strings.HasPrefix(p, dir+"/") {
			_, _ = unix.InotifyRmWatch(w.fd, uint32(wd))
			delete(w.wds, p)
			delete(w.dirs, wd)
		}
	}
}

// rename moves the watched directories under from to to.
func (w *watch) rename(from, to string) {
	moved := map[string]int{}
	for p, wd := range w.wds {
		if p == from || strings.HasPrefix(p, from+"/") {
			moved[to+strings.TrimPrefix(p, from)] = wd
			delete(w.wds, p)
		}
	}
	for p, wd := range moved {
		w.wds[p] = wd
		w.dirs[wd] = p
	}
}

// ---- the loop ----

func (w *watch) loop() {
	defer close(w.done)
	defer w.in.Close()
	buf := make([]byte, 64<<10)
	for {
		if w.ctx.Err() != nil {
			return
		}
		_ = w.in.SetReadDeadline(w.deadline())
		n, err := w.in.Read(buf)
		now := time.Now()
		if err != nil {
			if w.ctx.Err() != nil {
				return
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				w.tick(now)
				continue
			}
			w.end(proto.ErrCodeInternal, "reading inotify: "+err.Error())
			return
		}
		for _, ev := range parseInotify(buf[:n]) {
			w.handle(ev, now)
			if w.isEnded() {
				return
			}
		}
		w.tick(now)
	}
}

func (w *watch) isEnded() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ended
}

// deadline is when the loop must wake without an event: a rename's first half expires, or a
// coalesced modification is due.
func (w *watch) deadline() time.Time {
	var d time.Time
	if w.pending != nil {
		d = w.pendAt.Add(moveWait)
	}
	for _, m := range w.mods {
		if t := m.at.Add(proto.WatchCoalesce); d.IsZero() || t.Before(d) {
			d = t
		}
	}
	return d
}

// tick expires a rename's first half (the entry left the tree) and reports coalesced
// modifications whose window is over.
func (w *watch) tick(now time.Time) {
	if w.pending != nil && now.Sub(w.pendAt) >= moveWait {
		w.movedOut(w.pending)
	}
	for p, m := range w.mods {
		if now.Sub(m.at) < proto.WatchCoalesce {
			continue
		}
		if m.dirty {
			w.emit(proto.WatchEvent{Kind: proto.EventModified, Path: p})
			m.at, m.dirty = now, false
		} else {
			delete(w.mods, p)
		}
	}
}

func parseInotify(b []byte) []rawEvent {
	var out []rawEvent
	for len(b) >= unix.SizeofInotifyEvent {
		wd := int32(binary.NativeEndian.Uint32(b[0:]))
		mask := binary.NativeEndian.Uint32(b[4:])
		cookie := binary.NativeEndian.Uint32(b[8:])
		n := int(binary.NativeEndian.Uint32(b[12:]))
		if unix.SizeofInotifyEvent+n > len(b) {
			break
		}
		name := b[unix.SizeofInotifyEvent : unix.SizeofInotifyEvent+n]
		if i := strings.IndexByte(string(name), 0); i >= 0 {
			name = name[:i]
		}
		out = append(out, rawEvent{wd: int(wd), mask: mask, cookie: cookie, name: string(name)})
		b = b[unix.SizeofInotifyEvent+n:]
	}
	return out
}

// handle turns one inotify event into the watch's events.
func (w *watch) handle(ev rawEvent, now time.Time) {
	if ev.mask&unix.IN_Q_OVERFLOW != 0 {
		if w.pending != nil {
			w.movedOut(w.pending)
		}
		w.emit(proto.WatchEvent{Kind: proto.EventOverflow, Reason: proto.ReasonQueue})
		return
	}
	dir, ok := w.dirs[ev.wd]
	if ev.mask&unix.IN_IGNORED != 0 {
		if ok {
			delete(w.dirs, ev.wd)
			if w.wds[dir] == ev.wd {
				delete(w.wds, dir)
			}
		}
		if ev.wd == w.rootWD {
			w.end(proto.ErrCodeNotFound, "the watched folder "+absName(w.root)+" was deleted")
		}
		return
	}
	if !ok {
		return // a directory forgotten meanwhile
	}
	if ev.name == "" {
		// About the watched directory itself.
		if ev.wd == w.rootWD && ev.mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
			what := "deleted"
			if ev.mask&unix.IN_MOVE_SELF != 0 {
				what = "moved away"
			}
			if w.pending != nil {
				w.movedOut(w.pending)
			}
			w.end(proto.ErrCodeNotFound, "the watched folder "+absName(w.root)+" was "+what)
		}
		return
	}
	p := path.Join(dir, ev.name)
	isDir := ev.mask&unix.IN_ISDIR != 0
	if w.pending != nil && !(ev.mask&unix.IN_MOVED_TO != 0 && ev.cookie == w.pending.cookie) {
		w.movedOut(w.pending)
	}
	switch {
	case ev.mask&unix.IN_MOVED_FROM != 0:
		e := ev
		e.name = p
		w.pending, w.pendAt = &e, now
	case ev.mask&unix.IN_MOVED_TO != 0:
		if w.pending != nil {
			from := w.pending.name
			w.pending = nil
			w.moved(from, p, isDir)
		} else {
			w.movedIn(p, isDir)
		}
	case ev.mask&unix.IN_CREATE != 0:
		if ownNameIn(p) != "" {
			return
		}
		w.emit(proto.WatchEvent{Kind: proto.EventCreated, Path: p, IsDir: isDir})
		if isDir && w.recursive {
			_ = w.addTree(p, true, false)
		} else if !isDir && len(w.mods) < maxPendingMods {
			// Closing a file just created without writing it is no modification; its first
			// write is reported when the writer closes it, or at the window's end.
			w.mods[p] = &modState{at: now}
		}
	case ev.mask&unix.IN_DELETE != 0:
		if ownNameIn(p) != "" {
			return
		}
		w.flushMod(p)
		w.emit(proto.WatchEvent{Kind: proto.EventDeleted, Path: p, IsDir: isDir})
	case ev.mask&(unix.IN_MODIFY|unix.IN_ATTRIB) != 0:
		if ownNameIn(p) != "" || (isDir && ev.mask&unix.IN_MODIFY == 0) {
			return // a directory's own attributes: its entries report what changed
		}
		w.modified(p, now, false)
	case ev.mask&unix.IN_CLOSE_WRITE != 0:
		if ownNameIn(p) != "" {
			return
		}
		w.modified(p, now, true)
	}
}

// modified coalesces a file's modifications: the first in a window is reported at once, later
// ones once when the window ends (tick), or at once when the writer closes the file.
func (w *watch) modified(p string, now time.Time, closed bool) {
	m, ok := w.mods[p]
	switch {
	case !ok:
		if len(w.mods) < maxPendingMods {
			w.mods[p] = &modState{at: now}
		}
		w.emit(proto.WatchEvent{Kind: proto.EventModified, Path: p})
	case closed && m.dirty:
		w.emit(proto.WatchEvent{Kind: proto.EventModified, Path: p})
		m.at, m.dirty = now, false
	case !closed:
		m.dirty = true
	}
}

// flushMod reports a coalesced modification of p that is still due, and forgets p.
func (w *watch) flushMod(p string) {
	if m, ok := w.mods[p]; ok {
		if m.dirty {
			w.emit(proto.WatchEvent{Kind: proto.EventModified, Path: p})
		}
		delete(w.mods, p)
	}
}

// moved reports a rename inside the tree (or into or out of the server's own names).
func (w *watch) moved(from, to string, isDir bool) {
	fromOwn, toOwn := ownNameIn(from) != "", ownNameIn(to) != ""
	switch {
	case fromOwn && toOwn:
	case fromOwn:
		w.movedIn(to, isDir)
	case toOwn:
		w.movedOut(&rawEvent{name: from, mask: isDirMask(isDir)})
	default:
		w.flushMod(from)
		w.emit(proto.WatchEvent{Kind: proto.EventMoved, Path: to, From: from, IsDir: isDir})
		if isDir && w.recursive {
			w.rename(from, to)
		}
	}
}

func isDirMask(isDir bool) uint32 {
	if isDir {
		return unix.IN_ISDIR
	}
	return 0
}

// movedOut reports an entry that left the tree (a rename whose other half is not ours).
func (w *watch) movedOut(ev *rawEvent) {
	if w.pending == ev {
		w.pending = nil
	}
	if ownNameIn(ev.name) != "" {
		return
	}
	isDir := ev.mask&unix.IN_ISDIR != 0
	w.flushMod(ev.name)
	w.emit(proto.WatchEvent{Kind: proto.EventDeleted, Path: ev.name, IsDir: isDir})
	if isDir {
		w.forget(ev.name)
	}
}

// movedIn reports an entry that came into the tree; a directory under a recursive watch is
// watched and scanned.
func (w *watch) movedIn(p string, isDir bool) {
	if ownNameIn(p) != "" {
		return
	}
	w.emit(proto.WatchEvent{Kind: proto.EventCreated, Path: p, IsDir: isDir})
	if isDir && w.recursive {
		_ = w.addTree(p, true, false)
	}
}
