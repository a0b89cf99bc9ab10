package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// rootfsTar writes root's tree with writeRootfs and returns its entries, in order.
func rootfsTar(t *testing.T, root string, epoch time.Time) ([]*tar.Header, map[string]string, error) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := (&layerWriter{tw: tw, epoch: epoch}).writeRootfs(root); err != nil {
		return nil, nil, err
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	var hdrs []*tar.Header
	data := map[string]string{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		hdrs = append(hdrs, h)
		data[h.Name] = string(b)
	}
	return hdrs, data, nil
}

// The rootfs layer holds links as links (an absolute one that points at the builder's own
// files is never followed), a second name of a file as a hard link, modes with setuid and
// sticky bits, numeric owners, sorted names and the epoch as every mtime; it leaves out the
// completion marker and /dev's contents.
func TestWriteRootfs(t *testing.T) {
	root := t.TempDir()
	mk := func(p, content string, mode os.FileMode) {
		t.Helper()
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(full, mode); err != nil {
			t.Fatal(err)
		}
	}
	mk("usr/bin/bash", "#!bash", 0o755)
	mk("usr/bin/su", "su", 0o755)
	mk(".sbx-complete", "", 0o644)
	mk("dev/null-ish", "x", 0o644)
	if err := os.Mkdir(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(root, "tmp"), 0o777|os.ModeSticky)
	if err := os.Symlink("/etc/hostname", filepath.Join(root, "usr/bin/escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/bin", filepath.Join(root, "bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(root, "usr/bin/bash"), filepath.Join(root, "usr/bin/sh")); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(filepath.Join(root, "usr/bin/su"), 0, 42); err != nil && os.Geteuid() == 0 {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(root, "usr/bin/su"), 0o755|os.ModeSetuid) // after chown, which clears it
	epoch := time.Unix(1700000000, 0)
	hdrs, data, err := rootfsTar(t, root, epoch)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	byName := map[string]*tar.Header{}
	for _, h := range hdrs {
		names = append(names, h.Name)
		byName[h.Name] = h
		if !h.ModTime.Equal(epoch) || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: got mtime %v uname %q gname %q, want the epoch and no names", h.Name, h.ModTime, h.Uname, h.Gname)
		}
	}
	want := "bin dev/ tmp/ usr/ usr/bin/ usr/bin/bash usr/bin/escape usr/bin/sh usr/bin/su"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("entries: got %q, want %q", got, want)
	}
	if h := byName["usr/bin/escape"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "/etc/hostname" || data["usr/bin/escape"] != "" {
		t.Errorf("usr/bin/escape: got %+v, want a symlink to /etc/hostname with no content", h)
	}
	if h := byName["usr/bin/sh"]; h == nil || h.Typeflag != tar.TypeLink || h.Linkname != "usr/bin/bash" {
		t.Errorf("usr/bin/sh: got %+v, want a hard link to usr/bin/bash", h)
	}
	if h := byName["usr/bin/su"]; h == nil || h.Mode != 0o4755 || (os.Geteuid() == 0 && h.Gid != 42) {
		t.Errorf("usr/bin/su: got %+v, want mode 04755 and gid 42", h)
	}
	if h := byName["tmp/"]; h == nil || h.Mode != 0o1777 {
		t.Errorf("tmp/: got %+v, want mode 01777", h)
	}
	if data["usr/bin/bash"] != "#!bash" {
		t.Errorf("usr/bin/bash: got %q, want its content", data["usr/bin/bash"])
	}

	// The same tree twice gives the same bytes.
	var a, b bytes.Buffer
	for _, buf := range []*bytes.Buffer{&a, &b} {
		tw := tar.NewWriter(buf)
		if err := (&layerWriter{tw: tw, epoch: epoch}).writeRootfs(root); err != nil {
			t.Fatal(err)
		}
		tw.Close()
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Errorf("two tars of one tree differ")
	}
}

// A FIFO (or socket) in a rootfs is refused, not written or read.
func TestWriteRootfsRefusesSpecialFiles(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "usr/bin/pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := rootfsTar(t, root, time.Unix(0, 0))
	if err == nil || !strings.Contains(err.Error(), "no place in a base image") {
		t.Errorf("a FIFO: got %v, want it refused", err)
	}
}

// The same files give the same compressed blob and digest, from an empty cache each time.
func TestLayerReproducible(t *testing.T) {
	epoch := time.Unix(1700000000, 0)
	files := []file{{name: "b", mode: 0o644, data: []byte("b")}, {name: "a", mode: 0o755, dir: true}, {name: "a/x", mode: 0o600, uid: 65532, data: []byte("x")}}
	var digests []string
	for i := 0; i < 2; i++ {
		l, err := layerCache{dir: t.TempDir()}.layer(func(w *layerWriter) error { return w.writeFiles(files) }, epoch)
		if err != nil {
			t.Fatal(err)
		}
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d.String())
	}
	if digests[0] != digests[1] {
		t.Errorf("two layers of the same files: got %s and %s, want one digest", digests[0], digests[1])
	}
}

// prune keeps the most recently used blobs, whatever their age on disk.
func TestPrune(t *testing.T) {
	c := layerCache{dir: t.TempDir()}
	old := time.Now().Add(-time.Hour)
	for i, n := range []string{"a", "b", "c", "d"} {
		p := filepath.Join(c.dir, n+".tar.gz")
		if err := os.WriteFile(p, []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
		ts := old.Add(time.Duration(i) * time.Minute) // d is the newest
		os.Chtimes(p, ts, ts)
	}
	os.WriteFile(filepath.Join(c.dir, ".tar-123"), nil, 0o644) // a build's temporary file: not a blob
	if err := c.prune(2); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(c.dir)
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if want := ".tar-123 c.tar.gz d.tar.gz"; strings.Join(got, " ") != want {
		t.Errorf("after prune(2): got %q, want %q", got, want)
	}
}
