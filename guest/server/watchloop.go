package server

import (
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/guest/proto"
)

// A watch's loop (watch.go has the watch, its ring and its readers): it reads the inotify
// instance, keeps the watched tree's directories in step (addTree, forget, rename) and turns
// the kernel's events into the watch's (handle): renames paired by cookie, modifications
// coalesced, the server's own names left out.

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
		if len(d) > proto.MaxWatchPath {
			// Deeper than a path may name: not watched, so no event's path grows past the
			// bound (d itself is at most a bound and one name long).
			w.emit(proto.WatchEvent{Kind: proto.EventOverflow, Reason: proto.ReasonDirs, Path: d, IsDir: true})
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
