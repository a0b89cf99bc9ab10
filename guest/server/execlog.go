package server

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"sandboxd/guest/proto"
)

// An exec's output log keeps the newest output. It is a ring of segment files (<path>.<n>)
// that together hold the records from the oldest kept one to the newest; offsets are logical
// (they count every record ever appended, so they only grow). A record goes into the newest
// segment until that one would pass segMax; then a new segment begins. Once the kept segments
// hold more than max bytes, the oldest are deleted. A reader that has a segment open reads it
// to its end even after it was deleted (the file lives on until it is closed), so a follower
// never loses the segment it is in; at most one segment per reader outlives the bound. The
// exit record lives in memory and is never dropped. The state dir is a tmpfs inside the
// sandbox, so the bound is memory the sandbox's limit counts: max + segMax per reader.

const (
	// indexStride is the spacing of the sparse record index kept per segment, used to check
	// that a reader's offset is on a record boundary without walking the whole segment.
	indexStride = 64 << 10
	// segmentsPerLog: a log of max bytes is cut into segments of max/segmentsPerLog, so that
	// dropping the oldest one keeps at least (segmentsPerLog-1)/segmentsPerLog of the bound.
	segmentsPerLog = 8
	// minLogBytes is the smallest bound a log takes (a smaller MaxLogBytes is raised to it).
	minLogBytes = 4 << 10
)

// segment is one file of a log.
type segment struct {
	seq int
	// base is the logical offset of its first byte; size the bytes committed to it.
	base, size int64
	// payload counts the output bytes in it (size without the record headers).
	payload int64
	// index[i] is the logical offset of the first record starting at or after base+i*indexStride.
	index []int64
}

// execLog is one exec's output log: records appended by the pipe readers, read back by any
// number of readers through their own file handles. Readers learn about new bytes from the
// changed channel, which is closed (and replaced) on every change.
type execLog struct {
	path   string
	max    int64
	segMax int64

	mu   sync.Mutex
	f    *os.File   // the newest segment, open for appending; nil when it could not be made
	segs []*segment // the kept segments, oldest first; never empty
	next int        // seq of the next segment
	// end is the logical offset after the last output record; past the newest segment's end
	// when output was lost to a failed write (a gap, until the next segment begins there).
	end    int64
	kept   int64    // bytes in the kept segments
	counts [2]int64 // bytes the command wrote to stdout and stderr
	lost   int64    // output bytes the log no longer holds (dropped, or never written)
	ended  bool
	exit   *proto.ExitStatus
	// exitRec is the exit record, at logical offset end, once ended.
	exitRec []byte
	changed chan struct{}
	buf     []byte
	// recent are the newest records, which the newest segment holds too, from the logical
	// offset recentBase (-1: none) to end: a reader that has caught up takes the next ones
	// from here instead of opening and reading the file (traps into gVisor's kernel on a
	// command's first byte). At most recentMax bytes, and none once the log ended.
	recent     []byte
	recentBase int64
}

// recentMax bounds an exec log's copy of its newest records in memory (execLog.recent).
const recentMax = 64 << 10

func newExecLog(path string, limit int64) (*execLog, error) {
	limit = max(limit, minLogBytes)
	l := &execLog{path: path, max: limit, segMax: limit / segmentsPerLog, changed: make(chan struct{}), recentBase: -1}
	// The first segment must be new: segments left by an earlier server under this exec's id
	// are removed first (found by the exclusive create, without a look of its own per exec).
	err := l.newSegmentLocked(unix.O_EXCL)
	if errors.Is(err, fs.ErrExist) {
		removeLogFiles(path)
		err = l.newSegmentLocked(unix.O_EXCL)
	}
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (l *execLog) segPath(seq int) string { return fmt.Sprintf("%s.%d", l.path, seq) }

// remove deletes the log's files: its exec is forgotten. A reader with a segment open reads
// on; no new one finds the exec.
func (l *execLog) remove() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		_ = l.f.Close()
		l.f = nil
	}
	for _, sg := range l.segs {
		_ = os.Remove(l.segPath(sg.seq))
	}
}

// removeLogFiles deletes every segment file of the log at path (<path>.<n>).
func removeLogFiles(path string) {
	dir, base := filepath.Split(path)
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if seq, ok := strings.CutPrefix(e.Name(), base+"."); ok {
			if _, err := strconv.Atoi(seq); err == nil {
				_ = os.Remove(filepath.Join(dir, e.Name()))
			}
		}
	}
}

// maxPayload is the largest record payload that fits in one segment.
func (l *execLog) maxPayload() int {
	return int(min(int64(proto.MaxRecordPayload), l.segMax-proto.RecordHeaderLen))
}

// newSegmentLocked begins a new segment at the log's end. An empty newest segment is replaced
// rather than kept. When the file cannot be made, nothing changes. flags are added to the
// segment's open (O_EXCL for a log's first).
func (l *execLog) newSegmentLocked(flags int) error {
	seq := l.next
	// Never through a link: commands run as root in the box and could plant one in the state
	// folder under a coming segment's name.
	f, err := openLogFile(l.segPath(seq), flags|unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	l.next++
	if l.f != nil {
		_ = l.f.Close()
	}
	l.f = f
	l.recent, l.recentBase = l.recent[:0], -1
	if n := len(l.segs); n > 0 && l.segs[n-1].size == 0 {
		_ = os.Remove(l.segPath(l.segs[n-1].seq))
		l.segs = l.segs[:n-1]
	}
	l.segs = append(l.segs, &segment{seq: seq, base: l.end})
	return nil
}

// write appends p as records of kind, cut at the records' largest payload, in one write per
// segment. When the kept segments pass max, the oldest are dropped.
func (l *execLog) write(kind byte, p []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if kind == proto.RecordStderr {
		l.counts[1] += int64(len(p))
	} else {
		l.counts[0] += int64(len(p))
	}
	if l.ended {
		l.lost += int64(len(p))
		return
	}
	changed := false
	l.buf = l.buf[:0]
	for len(p) > 0 {
		cur := l.segs[len(l.segs)-1]
		room := l.segMax - cur.size - int64(len(l.buf)) - proto.RecordHeaderLen
		if l.f == nil || cur.base+cur.size != l.end || room <= 0 {
			// The newest segment is full (or a failed write left a gap after it): write what
			// is buffered, then begin the next one.
			changed = l.flushLocked() || changed
			if err := l.newSegmentLocked(0); err != nil {
				// No segment: the output is lost, and readers will see the gap.
				l.end += proto.RecordHeaderLen + int64(len(p))
				l.lost += int64(len(p))
				changed = true
				break
			}
			continue
		}
		n := int(min(int64(len(p)), int64(l.maxPayload()), room))
		l.buf = appendRecord(l.buf, kind, p[:n])
		p = p[n:]
	}
	changed = l.flushLocked() || changed
	l.trimLocked()
	if cap(l.buf) > 2*(maxCollect+proto.RecordHeaderLen) {
		l.buf = nil
	}
	if changed {
		l.notifyLocked()
	}
}

func appendRecord(buf []byte, kind byte, p []byte) []byte {
	buf = append(buf, kind, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(buf[len(buf)-4:], uint32(len(p)))
	return append(buf, p...)
}

// flushLocked writes the whole records in l.buf to the newest segment and indexes them. It
// reports whether the log changed (written, or lost: a gap).
func (l *execLog) flushLocked() bool {
	if len(l.buf) == 0 {
		return false
	}
	cur := l.segs[len(l.segs)-1]
	defer func() { l.buf = l.buf[:0] }()
	if _, err := l.f.Write(l.buf); err != nil {
		// A full state dir: the bytes are lost. The file may now hold a partial record;
		// truncate it back so that the segment stays a sequence of whole records. The lost
		// records become a gap: the next write begins a new segment after it.
		_ = l.f.Truncate(cur.size)
		_, _ = l.f.Seek(cur.size, io.SeekStart)
		l.end += int64(len(l.buf))
		l.lost += payloadOf(l.buf)
		l.recent, l.recentBase = l.recent[:0], -1
		return true
	}
	if at := cur.base + cur.size; len(l.buf) > recentMax {
		l.recent, l.recentBase = l.recent[:0], -1
	} else if l.recentBase < 0 || l.recentBase+int64(len(l.recent)) != at || len(l.recent)+len(l.buf) > recentMax {
		l.recent, l.recentBase = append(l.recent[:0], l.buf...), at
	} else {
		l.recent = append(l.recent, l.buf...)
	}
	for b, at := l.buf, cur.base+cur.size; len(b) >= proto.RecordHeaderLen; {
		for cur.base+int64(len(cur.index))*indexStride <= at {
			cur.index = append(cur.index, at)
		}
		n := int64(proto.RecordHeaderLen) + int64(binary.BigEndian.Uint32(b[1:proto.RecordHeaderLen]))
		at += n
		b = b[n:]
	}
	n := int64(len(l.buf))
	cur.size += n
	cur.payload += payloadOf(l.buf)
	l.kept += n
	l.end += n
	return true
}

// payloadOf counts the payload bytes of the whole records in b.
func payloadOf(b []byte) int64 {
	var n int64
	for len(b) >= proto.RecordHeaderLen {
		m := int(binary.BigEndian.Uint32(b[1:proto.RecordHeaderLen]))
		n += int64(m)
		b = b[min(len(b), proto.RecordHeaderLen+m):]
	}
	return n
}

// trimLocked drops the oldest segments while the kept ones hold more than max (never the
// newest one, which is at most segMax ≤ max).
func (l *execLog) trimLocked() {
	for l.kept > l.max && len(l.segs) > 1 {
		s := l.segs[0]
		_ = os.Remove(l.segPath(s.seq))
		l.kept -= s.size
		l.lost += s.payload
		l.segs[0] = nil
		l.segs = l.segs[1:]
	}
}

func (l *execLog) notifyLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// finish appends the exit record (kept in memory, never dropped) and marks the log ended; its
// file stays open until closeFile. The status it returns carries the byte counts.
func (l *execLog) finish(st proto.ExitStatus) proto.ExitStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	st.DroppedBytes = l.lost
	st.StdoutBytes, st.StderrBytes = l.counts[0], l.counts[1]
	payload, _ := json.Marshal(st)
	l.exitRec = appendRecord(nil, proto.RecordExit, payload)
	l.ended = true
	l.exit = &st
	l.buf = nil
	l.recent, l.recentBase = nil, -1
	l.notifyLocked()
	return st
}

// closeFile closes the newest segment's file of an ended log (finish leaves it open, so that
// the exit record's readers need not wait for the close). Nothing writes to an ended log.
func (l *execLog) closeFile() {
	l.mu.Lock()
	f := l.f
	l.f = nil
	l.mu.Unlock()
	if f != nil {
		_ = f.Close()
	}
}

// fromRecent copies the records at logical offset pos and after from the log's copy of its
// newest ones (execLog.recent) into buf, and returns how many bytes it copied: 0 when that
// copy does not hold pos.
func (l *execLog) fromRecent(pos int64, buf []byte) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.recentBase < 0 || pos < l.recentBase || pos >= l.recentBase+int64(len(l.recent)) {
		return 0
	}
	return copy(buf, l.recent[pos-l.recentBase:])
}

// sizeLocked is the logical size of the log: its end, and the exit record once ended.
func (l *execLog) sizeLocked() int64 {
	return l.end + int64(len(l.exitRec))
}

func (l *execLog) status() (size int64, exit *proto.ExitStatus) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sizeLocked(), l.exit
}

func (l *execLog) isEnded() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ended
}

// usage reports the bytes the kept segments hold on disk and the oldest kept offset.
func (l *execLog) usage() (kept, oldest int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.kept, l.segs[0].base
}

// errBadOffset is an offset a reader may not start at.
type errBadOffset struct{ msg string }

func (e *errBadOffset) Error() string { return e.msg }

// checkOffset reports whether a reader may start at off: a record boundary of the kept log,
// the end (or just after the exit record), or any offset no longer kept (the reader then
// gets a RecordTruncated first). It returns the log's size.
func (l *execLog) checkOffset(off int64) (int64, error) {
	l.mu.Lock()
	size := l.sizeLocked()
	if off < 0 || off > size {
		l.mu.Unlock()
		return size, &errBadOffset{fmt.Sprintf("offset %d is outside the log (0..%d)", off, size)}
	}
	if l.ended && off > l.end && off < size {
		l.mu.Unlock()
		return size, &errBadOffset{fmt.Sprintf("offset %d is inside the exit record", off)}
	}
	var seg *segment
	for _, s := range l.segs {
		if s.base < off && off < s.base+s.size {
			seg = s
			break
		}
	}
	if seg == nil {
		l.mu.Unlock()
		return size, nil
	}
	seq, segEnd := seg.seq, seg.base+seg.size
	i := min(int((off-seg.base)/indexStride), len(seg.index)-1)
	for i > 0 && seg.index[i] > off {
		i--
	}
	start := seg.index[i]
	base := seg.base
	l.mu.Unlock()

	f, err := openSegment(l.segPath(seq))
	if err != nil {
		return size, nil // dropped meanwhile: no longer kept
	}
	defer f.Close()
	br := bufio.NewReaderSize(io.NewSectionReader(f, start-base, segEnd-start), 32<<10)
	pos := start
	var hdr [proto.RecordHeaderLen]byte
	for pos < off {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			break
		}
		n := int64(binary.BigEndian.Uint32(hdr[1:]))
		if _, err := br.Discard(int(n)); err != nil {
			break
		}
		pos += proto.RecordHeaderLen + n
	}
	if pos != off {
		return size, &errBadOffset{fmt.Sprintf("offset %d is not on a record boundary", off)}
	}
	return size, nil
}

// logView is what a reader needs to know of the log at one moment.
type logView struct {
	// hold is the seq of the kept segment holding pos (base ≤ pos < base+size), or -1;
	// holdBase and holdEnd its base and the end of its committed bytes.
	hold              int
	holdBase, holdEnd int64
	// recentBase is where the log's copy of its newest records in memory begins (-1: none).
	recentBase int64
	// resume is, when no kept segment holds pos, where the kept log goes on after pos (the
	// end when nothing is kept after it).
	resume int64
	// rdNewest: the segment the reader has open is the newest, with rdSize bytes committed.
	rdNewest bool
	rdSize   int64
	end      int64
	ended    bool
	exitRec  []byte
	changed  <-chan struct{}
}

func (l *execLog) view(pos int64, rdSeq int) logView {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := logView{hold: -1, resume: l.end, end: l.end, ended: l.ended, exitRec: l.exitRec, changed: l.changed, recentBase: l.recentBase}
	if newest := l.segs[len(l.segs)-1]; newest.seq == rdSeq {
		v.rdNewest, v.rdSize = true, newest.size
	}
	for _, s := range l.segs {
		if s.base+s.size > pos {
			if s.base <= pos {
				v.hold, v.holdBase, v.holdEnd = s.seq, s.base, s.base+s.size
			} else {
				v.resume = s.base
			}
			break
		}
	}
	return v
}

// errLogBroken is a segment that could not be read although it should be there.
var errLogBroken = errors.New("guest: an exec's log file broke under its reader")

// copyTo writes the log from off (checked with checkOffset) to w, calling flush after each
// batch: whole records, with a RecordTruncated wherever the reader's position is no longer
// kept, and the exit record last. With follow it waits for more until the exit record or
// ctx's end; without, it stops at the current end. It returns w's error, errLogBroken, or nil.
// What it wrote after the last batch (the exit record, the tail of a log that ended) is left
// for the caller to flush: an HTTP/2 handler that returns then sends it in one frame with the
// stream's end, one write to the host where a flush would make two.
func (l *execLog) copyTo(ctx context.Context, w io.Writer, flush func() error, off int64, follow bool) error {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	pos := off
	var rd *os.File // the segment being read
	rdSeq, rdBase := -1, int64(0)
	defer func() {
		if rd != nil {
			_ = rd.Close()
		}
	}()
	closeRd := func() {
		_ = rd.Close()
		rd, rdSeq = nil, -1
	}
	for {
		if rd == nil {
			// Caught up: the newest records from memory, where the log still has them.
			if n := l.fromRecent(pos, buf); n > 0 {
				if _, err := w.Write(buf[:n]); err != nil {
					return err
				}
				pos += int64(n)
				if err := flush(); err != nil {
					return err
				}
				continue
			}
		}
		v := l.view(pos, rdSeq)
		switch {
		case rd != nil && !v.rdNewest:
			// A complete segment (a newer one began, and it may be deleted by now): read it to
			// its end through the open file.
			if err := copyRange(w, rd, buf, &pos, rdBase, -1); err != nil {
				return err
			}
			closeRd()
			if err := flush(); err != nil {
				return err
			}
			continue
		case rd != nil && pos < rdBase+v.rdSize:
			if err := copyRange(w, rd, buf, &pos, rdBase, rdBase+v.rdSize); err != nil {
				return err
			}
			if err := flush(); err != nil {
				return err
			}
			continue
		case rd != nil && pos < v.end:
			// Caught up with the newest segment, but output after it was lost: the gap below.
			closeRd()
			continue
		case rd == nil && v.hold >= 0:
			f, err := openSegment(l.segPath(v.hold))
			if err == nil {
				rd, rdSeq, rdBase = f, v.hold, v.holdBase
				continue
			}
			again := l.view(pos, -1)
			if again.hold != v.hold {
				continue // dropped just now: look again
			}
			if !segmentGone(err) {
				return errLogBroken // out of descriptors or memory, say: the host reads again later
			}
			// Still kept, yet its file cannot be opened: removed from under the log (commands
			// run as root and can reach the state folder). Its bytes are lost to readers, who
			// get a marker to its end (or to the newest records, which memory still holds)
			// rather than a reader that tries again forever.
			lostTo := again.holdEnd
			if again.recentBase > pos && again.recentBase < lostTo {
				lostTo = again.recentBase
			}
			if err := writeMarker(w, lostTo); err != nil {
				return err
			}
			pos = lostTo
			if err := flush(); err != nil {
				return err
			}
			continue
		case rd == nil && v.resume > pos:
			if err := writeMarker(w, v.resume); err != nil {
				return err
			}
			pos = v.resume
			if err := flush(); err != nil {
				return err
			}
			continue
		}
		// Nothing more to read now.
		if v.ended {
			if pos == v.end {
				if _, err := w.Write(v.exitRec); err != nil {
					return err
				}
			}
			return nil
		}
		if !follow {
			return flush()
		}
		select {
		case <-v.changed:
		case <-ctx.Done():
			return nil
		}
	}
}

// segmentGone reports whether openSegment failed because no segment file stands at its path
// any more: removed, or something else put there.
func segmentGone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EINVAL) ||
		errors.Is(err, unix.ENXIO) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENOTDIR) ||
		errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM)
}

// writeMarker writes a RecordTruncated record: the log goes on at offset resume.
func writeMarker(w io.Writer, resume int64) error {
	var rec [proto.RecordHeaderLen + proto.TruncatedPayloadLen]byte
	rec[0] = proto.RecordTruncated
	binary.BigEndian.PutUint32(rec[1:proto.RecordHeaderLen], proto.TruncatedPayloadLen)
	binary.BigEndian.PutUint64(rec[proto.RecordHeaderLen:], uint64(resume))
	_, err := w.Write(rec[:])
	return err
}

// copyRange copies the segment bytes from *pos up to limit (-1: the file's end) to w,
// advancing *pos; base is the segment's logical base.
func copyRange(w io.Writer, f *os.File, buf []byte, pos *int64, base, limit int64) error {
	for limit < 0 || *pos < limit {
		want := int64(len(buf))
		if limit >= 0 {
			want = min(want, limit-*pos)
		}
		n, err := f.ReadAt(buf[:want], *pos-base)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			*pos += int64(n)
		}
		switch {
		case err == io.EOF && limit < 0:
			return nil
		case err == io.EOF:
			return errLogBroken
		case err != nil:
			return errLogBroken
		}
	}
	return nil
}

// openLogFile opens a segment of a log (flags without O_CLOEXEC, which it adds) as a plain
// blocking file. os.OpenFile would first try to add it to Go's poller, which takes four fcntl
// calls and an epoll_ctl that a regular file always refuses: five system calls per exec
// started and per segment a reader opens, each a trap into gVisor's kernel.
func openLogFile(path string, flags int, perm uint32) (*os.File, error) {
	fd, err := retryEINTR(func() (int, error) { return unix.Open(path, flags|unix.O_CLOEXEC, perm) })
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// openSegment opens a segment of a log for reading: never through a link, never blocking in
// the open, and only a regular file. Commands run as root in the box and can put anything at a
// segment's path (a link to a file of PID 1's own /proc, a FIFO whose open would wait for a
// writer, a device): a reader then finds no segment there, as if it had been removed.
func openSegment(path string) (*os.File, error) {
	fd, err := retryEINTR(func() (int, error) {
		return unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err = unix.Fstat(fd, &st); err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
		err = unix.EINVAL
	}
	if err == nil {
		// A plain blocking file, as openLogFile makes (see there).
		_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, 0)
	}
	if err != nil {
		_ = unix.Close(fd)
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}
