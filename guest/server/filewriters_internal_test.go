package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandboxd/guest/proto"
)

// The writers write, chmod, time and close each file; a failed write is the first failure
// reported, named after its entry, and the files after it are still closed.
func TestFileWriters(t *testing.T) {
	dir := t.TempDir()
	w := newFileWriters(2)
	defer w.stop()
	mtime := time.Unix(1700000000, 0)
	submit := func(name string, flag int, body string) *proto.Error {
		f, err := os.OpenFile(filepath.Join(dir, name), flag|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		j := w.job()
		j.f, j.n, j.name, j.mode, j.mtime = f, copy(j.buf, body), name, 0o640, mtime
		return w.submit(j)
	}
	for i := range 20 {
		if perr := submit(strings.Repeat("f", i+1), os.O_WRONLY, strings.Repeat("x", i)); perr != nil {
			t.Fatalf("file %d: %v", i, perr)
		}
	}
	if perr := w.wait(); perr != nil {
		t.Fatal(perr)
	}
	for i := range 20 {
		p := filepath.Join(dir, strings.Repeat("f", i+1))
		b, err := os.ReadFile(p)
		fi, _ := os.Stat(p)
		if err != nil || string(b) != strings.Repeat("x", i) || fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(mtime) {
			t.Fatalf("file %d: %q %v, mode %v, mtime %v", i, b, err, fi.Mode(), fi.ModTime())
		}
	}

	// A file open read-only cannot be written: that entry's error.
	submit("readonly", os.O_RDONLY, "data")
	submit("after", os.O_WRONLY, "data")
	perr := w.wait()
	if perr == nil || !strings.Contains(perr.Message, "readonly") {
		t.Fatalf("wait = %v, want the failed entry's error", perr)
	}
	if perr := submit("later", os.O_WRONLY, "x"); perr == nil {
		t.Fatal("submit after a failure reported none")
	}
	w.stop()
	w.stop()
}
