package server

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestWriteTarNeverFollowsLinks: a tree with links out of it (as untrusted code plants them)
// is archived with the links as links, nothing of their targets.
func TestWriteTarNeverFollowsLinks(t *testing.T) {
	for name, write := range map[string]func(context.Context, string, io.Writer) (int, error){
		"WriteTar": WriteTar, "WriteTarReadahead": WriteTarReadahead,
	} {
		t.Run(name, func(t *testing.T) { testWriteTarNeverFollowsLinks(t, write) })
	}
}

func testWriteTarNeverFollowsLinks(t *testing.T, writeTar func(context.Context, string, io.Writer) (int, error)) {
	dir := t.TempDir()
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "a", "b"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "a", "b", "f"), []byte("data"), 0o640))
	must(os.Symlink(outside, filepath.Join(dir, "dirlink")))
	must(os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "a", "filelink")))
	must(os.WriteFile(filepath.Join(dir, randName(tmpPrefix)), []byte("x"), 0o600))

	var buf bytes.Buffer
	n, err := writeTar(context.Background(), dir, &buf)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*tar.Header{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		if bytes.Contains(body, []byte("secret")) {
			t.Fatalf("entry %s carries the outside file's content", h.Name)
		}
		got[h.Name] = h
	}
	want := map[string]byte{"a/": tar.TypeDir, "a/b/": tar.TypeDir, "a/b/f": tar.TypeReg,
		"dirlink": tar.TypeSymlink, "a/filelink": tar.TypeSymlink}
	if len(got) != len(want) || n != len(want) {
		t.Fatalf("got %d entries (%d counted): %v, want %v", len(got), n, keys(got), want)
	}
	for name, typ := range want {
		h, ok := got[name]
		if !ok || h.Typeflag != typ {
			t.Fatalf("entry %s: got %+v, want type %q", name, h, typ)
		}
	}
	if got["a/b/f"].Mode != 0o640 || got["a/b/f"].Size != 4 {
		t.Fatalf("a/b/f: got mode %o size %d, want 0640 and 4", got["a/b/f"].Mode, got["a/b/f"].Size)
	}
	if got["dirlink"].Linkname != outside {
		t.Fatalf("dirlink: got %q, want %q", got["dirlink"].Linkname, outside)
	}
}

func keys(m map[string]*tar.Header) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestWriteTarReadaheadSameArchive: the readahead helper changes nothing in the archive, over
// directories of more entries than one read of a directory returns, nested folders, links, a
// FIFO and the guest's own temporary files; a cancelled walk ends with its helpers.
func TestWriteTarReadaheadSameArchive(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range 1300 {
		sub := filepath.Join(dir, "big")
		if i%400 == 0 {
			sub = filepath.Join(dir, "big", fmt.Sprintf("d%d", i), "e")
		}
		must(os.MkdirAll(sub, 0o755))
		must(os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%04d", i)), bytes.Repeat([]byte{byte(i)}, i*7), 0o644))
	}
	must(os.Symlink("/etc/passwd", filepath.Join(dir, "big", "link")))
	must(syscall.Mkfifo(filepath.Join(dir, "big", "fifo"), 0o600))
	must(os.WriteFile(filepath.Join(dir, randName(tmpPrefix)), []byte("x"), 0o600))

	var plain, ahead bytes.Buffer
	n1, err := WriteTar(context.Background(), dir, &plain)
	must(err)
	n2, err := WriteTarReadahead(context.Background(), dir, &ahead)
	must(err)
	if n1 != n2 || !bytes.Equal(plain.Bytes(), ahead.Bytes()) {
		t.Fatalf("WriteTarReadahead wrote %d entries (%d bytes), WriteTar %d (%d bytes): the archives differ", n2, ahead.Len(), n1, plain.Len())
	}
	if n1 < 1300 {
		t.Fatalf("%d entries, want the 1,300 files and their folders", n1)
	}

	ctx, cancel := context.WithCancel(context.Background())
	w := &cancelAfter{n: 64 << 10, cancel: cancel}
	if _, err := WriteTarReadahead(ctx, dir, w); err == nil {
		t.Fatal("a walk cancelled midway: no error")
	}
}

// cancelAfter cancels its context once n bytes were written to it.
type cancelAfter struct {
	n      int
	cancel context.CancelFunc
}

func (c *cancelAfter) Write(p []byte) (int, error) {
	c.n -= len(p)
	if c.n <= 0 {
		c.cancel()
	}
	return len(p), nil
}

// TestReadaheadHostileSwap: files the workload swaps after the folder was listed (a FIFO, a
// link to a FIFO outside, a link to a file outside) do not block the readahead helper (it
// opens without following links and without waiting for a FIFO's writer).
func TestReadaheadHostileSwap(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	for _, name := range []string{"fifo", "linkfifo", "linkfile"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ents, err := d.ReadDir(-1)
	if err != nil {
		t.Fatal(err)
	}
	// Swapped after the listing, which still says regular files.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(syscall.Mkfifo(filepath.Join(outside, "fifo"), 0o600))
	must(os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600))
	for name, target := range map[string]string{"linkfifo": filepath.Join(outside, "fifo"), "linkfile": filepath.Join(outside, "secret")} {
		must(os.Remove(filepath.Join(dir, name)))
		must(os.Symlink(target, filepath.Join(dir, name)))
	}
	must(os.Remove(filepath.Join(dir, "fifo")))
	must(syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600))

	var at atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		readahead(int(d.Fd()), ents, &at, make(chan struct{}), make(chan struct{}))
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the readahead helper blocked on a swapped entry")
	}
}
