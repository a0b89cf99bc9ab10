package guest

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"sync"
)

// indexStride is the spacing of the sparse record index used to check that a follower's
// offset is on a record boundary without walking the whole log.
const indexStride = 64 << 10

// execLog is one exec's output log: records appended by the pipe readers, read back by any
// number of followers through their own file handles. Followers learn about new bytes from
// the changed channel, which is closed (and replaced) on every append.
type execLog struct {
	path string
	max  int64

	mu      sync.Mutex
	f       *os.File
	size    int64
	dropped int64
	index   []int64 // index[i] = offset of the first record starting at or after i*indexStride
	ended   bool
	exit    *ExitStatus
	changed chan struct{}
	buf     []byte
}

func newExecLog(path string, max int64) (*execLog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	return &execLog{path: path, max: max, f: f, changed: make(chan struct{})}, nil
}

// write appends p as records of kind, cut at MaxRecordPayload, in one write to the log file;
// what does not fit under max is dropped and counted.
func (l *execLog) write(kind byte, p []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		l.dropped += int64(len(p))
		return
	}
	l.buf = l.buf[:0]
	for len(p) > 0 {
		room := l.max - l.size - int64(len(l.buf)) - RecordHeaderLen
		if room <= 0 {
			l.dropped += int64(len(p))
			break
		}
		n := min(len(p), MaxRecordPayload, int(min(room, int64(MaxRecordPayload))))
		l.buf = appendRecord(l.buf, kind, p[:n])
		p = p[n:]
	}
	if l.flushLocked() {
		l.notifyLocked()
	}
}

func appendRecord(buf []byte, kind byte, p []byte) []byte {
	buf = append(buf, kind, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(buf[len(buf)-4:], uint32(len(p)))
	return append(buf, p...)
}

func (l *execLog) appendLocked(kind byte, p []byte) bool {
	l.buf = appendRecord(l.buf[:0], kind, p)
	return l.flushLocked()
}

// flushLocked writes the whole records in l.buf to the log file and indexes them. It reports
// whether anything was written.
func (l *execLog) flushLocked() bool {
	if len(l.buf) == 0 {
		return false
	}
	defer func() {
		if cap(l.buf) > 2*(maxCollect+RecordHeaderLen) {
			l.buf = nil
		}
	}()
	if _, err := l.f.Write(l.buf); err != nil {
		// A full state dir: the bytes are lost. The file may now hold a partial record;
		// truncate it back so that the log stays a sequence of whole records.
		_ = l.f.Truncate(l.size)
		_, _ = l.f.Seek(l.size, io.SeekStart)
		for b := l.buf; len(b) >= RecordHeaderLen; {
			n := int(binary.BigEndian.Uint32(b[1:RecordHeaderLen]))
			l.dropped += int64(n)
			b = b[RecordHeaderLen+n:]
		}
		return false
	}
	for b, at := l.buf, l.size; len(b) >= RecordHeaderLen; {
		for int64(len(l.index))*indexStride <= at {
			l.index = append(l.index, at)
		}
		n := int64(RecordHeaderLen) + int64(binary.BigEndian.Uint32(b[1:RecordHeaderLen]))
		at += n
		b = b[n:]
	}
	l.size += int64(len(l.buf))
	return true
}

func (l *execLog) notifyLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// finish appends the exit record (never subject to max), marks the log ended and closes it.
func (l *execLog) finish(st ExitStatus) ExitStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	st.DroppedBytes = l.dropped
	payload, _ := json.Marshal(st)
	l.appendLocked(RecordExit, payload)
	l.ended = true
	l.exit = &st
	_ = l.f.Close()
	l.buf = nil
	l.notifyLocked()
	return st
}

// state is what a follower needs: the committed size, whether the exit record is in, and a
// channel closed at the next change.
func (l *execLog) state() (size int64, ended bool, changed <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.size, l.ended, l.changed
}

func (l *execLog) status() (size int64, exit *ExitStatus) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.size, l.exit
}

func (l *execLog) isEnded() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ended
}

// boundary reports whether off is the offset of a record boundary of the log read through r
// (0 ≤ off ≤ size is checked by the caller).
func (l *execLog) boundary(r io.ReaderAt, off int64) bool {
	l.mu.Lock()
	size := l.size
	if off == 0 || off == size {
		l.mu.Unlock()
		return true
	}
	i := min(int(off/indexStride), len(l.index)-1)
	for i > 0 && l.index[i] > off {
		i--
	}
	start := l.index[i]
	l.mu.Unlock()

	br := bufio.NewReaderSize(io.NewSectionReader(r, start, size-start), 32<<10)
	pos := start
	var hdr [RecordHeaderLen]byte
	for pos < off {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return false
		}
		n := int64(binary.BigEndian.Uint32(hdr[1:]))
		if _, err := br.Discard(int(n)); err != nil {
			return false
		}
		pos += RecordHeaderLen + n
	}
	return pos == off
}
