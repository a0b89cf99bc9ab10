// Package tarsafetest is test-only: checks of what tarsafe's name rule promises, and seed
// archives, for the fuzz targets of the packages that read tars with it.
package tarsafetest

import (
	"archive/tar"
	"bytes"
	"os"
	"path"
	"strings"
	"testing"
	"time"
)

// CheckCleanName fails t unless c, accepted for n, is "." or a clean relative path without
// "..".
func CheckCleanName(t testing.TB, n, c string) {
	t.Helper()
	if c == "." {
		return
	}
	if c == "" || strings.HasPrefix(c, "/") || path.Clean(c) != c || strings.Contains(c, "\x00") {
		t.Fatalf("%q: accepted as %q, which is not a clean relative path", n, c)
	}
	for part := range strings.SplitSeq(c, "/") {
		if part == ".." || part == "." || part == "" {
			t.Fatalf("%q: accepted as %q, which has the element %q", n, c, part)
		}
	}
}

// Ent is an entry of a seed archive for a fuzz target; Typ 0 is a regular file and Mode 0 is
// 0644.
type Ent struct {
	Name, Body, Link string
	Typ              byte
	Mode             int64
}

// Tar builds a tar of ents (a fixed modification time, so a seed is the same bytes each run).
func Tar(tb testing.TB, ents []Ent) []byte {
	tb.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		h := &tar.Header{Name: e.Name, Typeflag: e.Typ, Linkname: e.Link, Mode: e.Mode, ModTime: time.Unix(1700000000, 0)}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.Body))
		}
		if err := tw.WriteHeader(h); err != nil {
			tb.Fatalf("tar header %q: %v", e.Name, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte(e.Body)); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	return b.Bytes()
}

// TempDir is a fresh folder removed when tb ends: on a tmpfs when there is one (a fuzz
// target's extraction or spool costs milliseconds in unlinks and renames on a disk file
// system, microseconds on tmpfs).
func TempDir(tb testing.TB) string {
	tb.Helper()
	d, err := os.MkdirTemp("/dev/shm", "sbx-fuzz-")
	if err != nil {
		return tb.TempDir()
	}
	tb.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}
