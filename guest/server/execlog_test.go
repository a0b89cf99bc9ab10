package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"sandboxd/guest/proto"
)

// Unit tests of the ring log (execlog.go): records written straight into an execLog, read
// back through copyTo, the same code GET /v1/execs/{id}/log runs.

type logRec struct {
	kind   byte
	data   []byte
	offset int64 // after the record (for a marker: where the log resumes)
	missed int64 // for a marker
}

// parseLog splits a copyTo stream that began at off into records, the way LogReader does.
func parseLog(t *testing.T, b []byte, off int64) []logRec {
	t.Helper()
	var out []logRec
	for len(b) > 0 {
		if len(b) < proto.RecordHeaderLen {
			t.Fatalf("a partial record header at offset %d", off)
		}
		kind, n := b[0], int(binary.BigEndian.Uint32(b[1:proto.RecordHeaderLen]))
		if len(b) < proto.RecordHeaderLen+n {
			t.Fatalf("a partial record at offset %d", off)
		}
		data := b[proto.RecordHeaderLen : proto.RecordHeaderLen+n]
		b = b[proto.RecordHeaderLen+n:]
		if kind == proto.RecordTruncated {
			if n != proto.TruncatedPayloadLen {
				t.Fatalf("marker payload: got %d bytes, want %d", n, proto.TruncatedPayloadLen)
			}
			resume := int64(binary.BigEndian.Uint64(data))
			if resume <= off {
				t.Fatalf("marker at %d resumes at %d, want a later offset", off, resume)
			}
			out = append(out, logRec{kind: kind, offset: resume, missed: resume - off})
			off = resume
			continue
		}
		off += int64(proto.RecordHeaderLen + n)
		out = append(out, logRec{kind: kind, data: append([]byte(nil), data...), offset: off})
	}
	return out
}

func readAll(t *testing.T, l *execLog, off int64) []logRec {
	t.Helper()
	if _, err := l.checkOffset(off); err != nil {
		t.Fatalf("checkOffset(%d): %v", off, err)
	}
	var buf bytes.Buffer
	if err := l.copyTo(context.Background(), &buf, func() error { return nil }, off, false); err != nil {
		t.Fatalf("copyTo: %v", err)
	}
	return parseLog(t, buf.Bytes(), off)
}

// lines is the output the tests write: numbered lines, so any piece shows where it came from.
func lines(from, to int) []byte {
	var b bytes.Buffer
	for i := from; i < to; i++ {
		fmt.Fprintf(&b, "line %08d\n", i)
	}
	return b.Bytes()
}

func diskBytes(t *testing.T, dir string) int64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		n += fi.Size()
	}
	return n
}

func newTestLog(t *testing.T, max int64) (*execLog, string) {
	t.Helper()
	dir := t.TempDir()
	l, err := newExecLog(filepath.Join(dir, "log"), max)
	if err != nil {
		t.Fatal(err)
	}
	return l, dir
}

func TestRingLogKeepsTheNewest(t *testing.T) {
	const max = 64 << 10
	l, dir := newTestLog(t, max)
	out := lines(0, 100000) // 1.5 MB: about 23 times the bound
	var logical int64
	for p := out; len(p) > 0; {
		n := min(len(p), 3000)
		l.write(proto.RecordStdout, p[:n])
		p = p[n:]
		size, _ := l.status()
		if size < logical {
			t.Fatalf("log size went back from %d to %d", logical, size)
		}
		logical = size
		if kept, _ := l.usage(); kept > max {
			t.Fatalf("kept %d bytes, want ≤ %d", kept, max)
		}
		if d := diskBytes(t, dir); d > max {
			t.Fatalf("segment files hold %d bytes, want ≤ %d", d, max)
		}
	}
	l.write(proto.RecordStderr, []byte("bye\n"))
	st := l.finish(proto.ExitStatus{ExitCode: 3})
	if st.StdoutBytes != int64(len(out)) || st.StderrBytes != 4 {
		t.Errorf("counts: got stdout %d stderr %d, want %d and 4", st.StdoutBytes, st.StderrBytes, len(out))
	}

	recs := readAll(t, l, 0)
	if recs[0].kind != proto.RecordTruncated {
		t.Fatalf("first record: got kind %d, want the truncation marker", recs[0].kind)
	}
	_, oldest := l.usage()
	if recs[0].offset != oldest || recs[0].missed != oldest {
		t.Errorf("marker: got resume %d missed %d, want %d and %d", recs[0].offset, recs[0].missed, oldest, oldest)
	}
	var kept []byte
	var headers int64
	for _, r := range recs[1 : len(recs)-2] {
		if r.kind != proto.RecordStdout {
			t.Fatalf("got record kind %d in the middle, want stdout", r.kind)
		}
		kept = append(kept, r.data...)
		headers += proto.RecordHeaderLen
	}
	if !bytes.HasSuffix(out, kept) || len(kept) < max*6/8 {
		t.Errorf("kept %d bytes: want a suffix of the output of at least %d", len(kept), max*6/8)
	}
	if int64(len(kept))+headers > max {
		t.Errorf("kept %d log bytes, want ≤ %d", int64(len(kept))+headers, max)
	}
	if int64(len(kept))+st.DroppedBytes != int64(len(out)) {
		t.Errorf("kept %d + dropped %d, want %d", len(kept), st.DroppedBytes, len(out))
	}
	if r := recs[len(recs)-2]; r.kind != proto.RecordStderr || string(r.data) != "bye\n" {
		t.Errorf("second to last: got %d %q, want stderr bye", r.kind, r.data)
	}
	last := recs[len(recs)-1]
	var got proto.ExitStatus
	if last.kind != proto.RecordExit || json.Unmarshal(last.data, &got) != nil || got.ExitCode != 3 {
		t.Fatalf("last record: got kind %d %s, want the exit", last.kind, last.data)
	}
	size, _ := l.status()
	if last.offset != size {
		t.Errorf("exit record ends at %d, want the log size %d", last.offset, size)
	}
	// Offsets are logical: the size counts every record ever written.
	records := (len(out) + 2999) / 3000 // at least one record per write
	if size < int64(len(out))+int64(records)*proto.RecordHeaderLen {
		t.Errorf("size %d, want at least every byte and header written (%d)", size, len(out)+records*proto.RecordHeaderLen)
	}
}

func TestRingLogOffsets(t *testing.T) {
	l, _ := newTestLog(t, 8<<10)
	for i := 0; i < 200; i++ {
		l.write(proto.RecordStdout, lines(i*10, i*10+10))
	}
	l.finish(proto.ExitStatus{})
	size, _ := l.status()
	_, oldest := l.usage()
	all := readAll(t, l, 0)
	// Every record boundary of the kept log is a valid start; resuming there gives the rest.
	for i, r := range all[:len(all)-1] {
		rest := readAll(t, l, r.offset)
		if len(rest) != len(all)-i-1 || rest[len(rest)-1].kind != proto.RecordExit {
			t.Fatalf("from %d: got %d records, want %d ending in the exit", r.offset, len(rest), len(all)-i-1)
		}
	}
	tests := []struct {
		name string
		off  int64
		ok   bool
	}{
		{"before-the-oldest", oldest / 2, true},
		{"not-a-boundary", oldest + 1, false},
		{"inside-the-exit", size - 1, false},
		{"past-the-end", size + 1, false},
		{"negative", -1, false},
		{"after-the-exit", size, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := l.checkOffset(tt.off)
			if (err == nil) != tt.ok {
				t.Errorf("checkOffset(%d): got %v, want ok=%v", tt.off, err, tt.ok)
			}
		})
	}
	if recs := readAll(t, l, size); len(recs) != 0 {
		t.Errorf("after the exit: got %d records, want none", len(recs))
	}
	recs := readAll(t, l, oldest/2)
	if recs[0].kind != proto.RecordTruncated || recs[0].offset != oldest || recs[0].missed != oldest-oldest/2 {
		t.Errorf("from before the oldest: got %+v, want a marker resuming at %d", recs[0], oldest)
	}
}

// TestRingLogFollowers: followers that keep up see every byte; one that stalls keeps reading
// the segment it has open after it was deleted, then gets a marker and the newest output.
// Every follower ends with the exit record, and what each got is consistent with the output.
func TestRingLogFollowers(t *testing.T) {
	const max = 32 << 10
	l, _ := newTestLog(t, max)
	out := lines(0, 40000) // 600 KB
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	type result struct {
		data []byte
		recs []logRec
		err  error
	}
	follow := func(w io.Writer) error {
		return l.copyTo(ctx, w, func() error { return nil }, 0, true)
	}
	const fast = 3
	results := make([]result, fast+1)
	// The fast followers count what they received; the writer waits for them after each
	// piece, so they keep up however loaded the machine is.
	var reached [fast]atomic.Int64
	var wg sync.WaitGroup
	for i := range fast {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &countingWriter{n: &reached[i]}
			results[i].err = follow(w)
			results[i].data = w.buf.Bytes()
		}()
	}
	// The first segment is written before the slow follower starts, so that the segment it
	// opens and then stalls on is complete.
	p := out
	for int64(len(out)-len(p)) < l.segMax-1000 {
		l.write(proto.RecordStdout, p[:1000])
		p = p[1000:]
	}
	// The slow follower reads through a pipe it stops reading after its first piece.
	pr, pw := io.Pipe()
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := follow(pw)
		pw.CloseWithError(err)
	}()
	first := make([]byte, 100)
	if _, err := io.ReadFull(pr, first); err != nil {
		t.Fatal(err)
	}
	for len(p) > 0 {
		n := min(len(p), 1000)
		l.write(proto.RecordStdout, p[:n])
		p = p[n:]
		size, _ := l.status()
		for i := range reached {
			for reached[i].Load() < size && ctx.Err() == nil {
				time.Sleep(20 * time.Microsecond)
			}
		}
	}
	l.finish(proto.ExitStatus{ExitCode: 0})
	rest, err := io.ReadAll(pr)
	if err != nil {
		t.Fatal(err)
	}
	results[fast].data = append(first, rest...)
	wg.Wait()

	for i := range results {
		r := &results[i]
		if r.err != nil {
			t.Fatalf("follower %d: %v", i, r.err)
		}
		r.recs = parseLog(t, r.data, 0)
		if last := r.recs[len(r.recs)-1]; last.kind != proto.RecordExit {
			t.Fatalf("follower %d: last record kind %d, want the exit", i, last.kind)
		}
		// The pieces between markers are contiguous pieces of the output at their offsets;
		// the last one ends at the output's end.
		var got []byte
		var pieces [][]byte
		for _, rec := range r.recs {
			switch rec.kind {
			case proto.RecordTruncated:
				pieces = append(pieces, got)
				got = nil
			case proto.RecordStdout:
				got = append(got, rec.data...)
			}
		}
		pieces = append(pieces, got)
		if !bytes.HasSuffix(out, pieces[len(pieces)-1]) {
			t.Errorf("follower %d: the piece after the last marker is not the end of the output", i)
		}
		if !bytes.HasPrefix(out, pieces[0]) {
			t.Errorf("follower %d: the first piece is not the start of the output", i)
		}
		for j, p := range pieces {
			if !bytes.Contains(out, p) {
				t.Errorf("follower %d: piece %d (%d bytes) is not in the output", i, j, len(p))
			}
		}
		if i < fast && (len(pieces) != 1 || !bytes.Equal(pieces[0], out)) {
			t.Errorf("follower %d kept up: got %d pieces (%d markers), want the whole output", i, len(pieces), len(pieces)-1)
		}
		if i == fast {
			if len(pieces) < 2 {
				t.Fatalf("the stalled follower got no marker")
			}
			// It had the first segment open: it read all of it, although it was deleted.
			if len(pieces[0]) < int(l.segMax)*3/4 {
				t.Errorf("the stalled follower got %d bytes before the marker, want its whole first segment (~%d)", len(pieces[0]), l.segMax)
			}
		}
	}
}

// TestRingLogGapAfterAFailedWrite: output lost to a failed write is a gap that readers see as a
// marker in place; the log goes on in a new segment.
func TestRingLogGapAfterAFailedWrite(t *testing.T) {
	l, _ := newTestLog(t, 1<<20)
	l.write(proto.RecordStdout, []byte("before\n"))
	l.mu.Lock()
	_ = l.f.Close() // the next write fails, as on a full state dir
	l.mu.Unlock()
	l.write(proto.RecordStdout, []byte("lost\n"))
	l.write(proto.RecordStdout, []byte("after\n"))
	st := l.finish(proto.ExitStatus{})
	if st.DroppedBytes != 5 || st.StdoutBytes != 18 {
		t.Errorf("got dropped %d stdout %d, want 5 and 18", st.DroppedBytes, st.StdoutBytes)
	}
	recs := readAll(t, l, 0)
	var kinds []byte
	for _, r := range recs {
		kinds = append(kinds, r.kind)
	}
	want := []byte{proto.RecordStdout, proto.RecordTruncated, proto.RecordStdout, proto.RecordExit}
	if !bytes.Equal(kinds, want) || string(recs[0].data) != "before\n" || string(recs[2].data) != "after\n" ||
		recs[1].missed != proto.RecordHeaderLen+5 {
		t.Fatalf("got %+v, want before, a marker of %d bytes, after, exit", recs, proto.RecordHeaderLen+5)
	}
}

// TestRingLogExitAlwaysKept: the exit record is there whatever was dropped, for a reader from
// any kept or dropped offset; a follower waiting at the end gets it.
func TestRingLogExitAlwaysKept(t *testing.T) {
	l, _ := newTestLog(t, minLogBytes)
	done := make(chan []byte)
	go func() {
		var buf bytes.Buffer
		_ = l.copyTo(context.Background(), &buf, func() error { return nil }, 0, true)
		done <- buf.Bytes()
	}()
	for i := 0; i < 100; i++ {
		l.write(proto.RecordStdout, lines(i*100, i*100+100))
	}
	l.finish(proto.ExitStatus{ExitCode: 9})
	select {
	case b := <-done:
		recs := parseLog(t, b, 0)
		if recs[len(recs)-1].kind != proto.RecordExit {
			t.Fatalf("follower: last kind %d, want the exit", recs[len(recs)-1].kind)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the follower did not end after the exit")
	}
	_, oldest := l.usage()
	for _, off := range []int64{0, oldest} {
		recs := readAll(t, l, off)
		if recs[len(recs)-1].kind != proto.RecordExit {
			t.Errorf("from %d: last kind %d, want the exit", off, recs[len(recs)-1].kind)
		}
	}
}

// countingWriter keeps what it is given and publishes how much.
type countingWriter struct {
	buf bytes.Buffer
	n   *atomic.Int64
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	w.n.Add(int64(len(p)))
	return len(p), nil
}

// TestRingLogNewestFromMemory: a reader that has caught up takes the newest records from the
// log's copy in memory, not from the segment file (here removed, so a read of the file would
// fail), byte for byte as the file holds them; writes larger than the copy's bound, and every
// read once the log ended, go through the files.
func TestRingLogNewestFromMemory(t *testing.T) {
	l, _ := newTestLog(t, 1<<20)
	l.write(proto.RecordStdout, []byte("a\n"))
	l.write(proto.RecordStderr, []byte("b\n"))
	if err := os.Remove(l.segPath(0)); err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, l, 0)
	if len(recs) != 2 || string(recs[0].data) != "a\n" || recs[1].kind != proto.RecordStderr || string(recs[1].data) != "b\n" {
		t.Fatalf("from offset 0 got %+v, want a and b from memory", recs)
	}
	if recs := readAll(t, l, recs[0].offset); len(recs) != 1 || string(recs[0].data) != "b\n" {
		t.Fatalf("from after a got %+v, want b", recs)
	}

	l2, _ := newTestLog(t, 1<<20)
	big := lines(0, recentMax/14+1) // over the bound
	l2.write(proto.RecordStdout, []byte("first\n"))
	l2.write(proto.RecordStdout, big)
	l2.mu.Lock()
	inMemory := len(l2.recent)
	l2.mu.Unlock()
	if inMemory != 0 {
		t.Errorf("after a write of %d bytes the log keeps %d in memory, want none (bound %d)", len(big), inMemory, recentMax)
	}
	l2.write(proto.RecordStdout, []byte("last\n"))
	st := l2.finish(proto.ExitStatus{})
	l2.mu.Lock()
	inMemory = cap(l2.recent)
	l2.mu.Unlock()
	if inMemory != 0 {
		t.Errorf("an ended log keeps %d bytes of records in memory, want none", inMemory)
	}
	var got []byte
	recs = readAll(t, l2, 0)
	for _, r := range recs[:len(recs)-1] {
		got = append(got, r.data...)
	}
	if want := append(append([]byte("first\n"), big...), "last\n"...); !bytes.Equal(got, want) || recs[len(recs)-1].kind != proto.RecordExit {
		t.Errorf("read back %d bytes (last record kind %d), want the %d written and the exit", len(got), recs[len(recs)-1].kind, len(want))
	}
	if st.StdoutBytes != int64(len(big))+11 {
		t.Errorf("stdout bytes %d, want %d", st.StdoutBytes, len(big)+11)
	}
}

// TestRingLogSegmentRemovedUnderIt: a command (root in the box) that removes its exec's log
// files loses that output, and only that: readers get a marker over the bytes they can no
// longer read, then what follows, then the exit, and never wait for a file that is gone.
func TestRingLogSegmentRemovedUnderIt(t *testing.T) {
	l, _ := newTestLog(t, 1<<20)
	big := lines(0, recentMax/14+1) // not kept in memory
	l.write(proto.RecordStdout, big)
	if err := os.Remove(l.segPath(0)); err != nil {
		t.Fatal(err)
	}
	read := func(off int64) []logRec {
		t.Helper()
		done := make(chan []logRec, 1)
		go func() { done <- readAll(t, l, off) }()
		select {
		case recs := <-done:
			return recs
		case <-time.After(10 * time.Second):
			t.Fatal("the reader did not return within 10 s")
			return nil
		}
	}
	l.mu.Lock()
	end := l.end // the records of big (cut at the largest payload)
	l.mu.Unlock()
	if recs := read(0); len(recs) != 1 || recs[0].kind != proto.RecordTruncated || recs[0].offset != end {
		t.Fatalf("got %+v, want one marker to %d", recs, end)
	}
	l.write(proto.RecordStdout, []byte("after\n"))
	if recs := read(0); len(recs) != 2 || recs[0].offset != end || string(recs[1].data) != "after\n" {
		t.Fatalf("got %+v, want the marker, then the newer output", recs)
	}
	l.finish(proto.ExitStatus{ExitCode: 3})
	recs := read(0)
	if len(recs) != 2 || recs[0].kind != proto.RecordTruncated || recs[1].kind != proto.RecordExit {
		t.Fatalf("after the end got %+v, want a marker over all the output (its file is gone) and the exit", recs)
	}
}

// TestRingLogSegmentReplacedUnderIt: what a command (root in the box) puts at a segment's path
// in the log's place, a link to a file of its choice (PID 1's own /proc files among them) or a
// FIFO, is never read: the reader finds no segment there, gets a marker over the lost bytes
// and returns (an open of the FIFO would have waited for a writer). A regular file put there is
// read like the log it replaced: the command could as well have written its bytes into the log.
func TestRingLogSegmentReplacedUnderIt(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, bytes.Repeat([]byte("SECRET\n"), 20000), 0o600); err != nil {
		t.Fatal(err)
	}
	plants := map[string]func(path string) error{
		"link": func(path string) error { return os.Symlink(secret, path) },
		"fifo": func(path string) error { return syscall.Mkfifo(path, 0o600) },
	}
	for name, plant := range plants {
		t.Run(name, func(t *testing.T) {
			l, _ := newTestLog(t, 1<<20)
			l.write(proto.RecordStdout, lines(0, recentMax/14+1)) // not kept in memory
			if err := os.Remove(l.segPath(0)); err != nil {
				t.Fatal(err)
			}
			if err := plant(l.segPath(0)); err != nil {
				t.Fatal(err)
			}
			done := make(chan []logRec, 1)
			go func() { done <- readAll(t, l, 0) }()
			var recs []logRec
			select {
			case recs = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the reader did not return within 10 s")
			}
			for _, r := range recs {
				if bytes.Contains(r.data, []byte("SECRET")) {
					t.Fatalf("the reader read the planted file's content: %.40q", r.data)
				}
			}
			if len(recs) != 1 || recs[0].kind != proto.RecordTruncated {
				t.Fatalf("got %d records, want one marker", len(recs))
			}
		})
	}
}
