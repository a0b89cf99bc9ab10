package server

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestWriteTarNeverFollowsLinks: a tree with links out of it (as untrusted code plants them)
// is archived with the links as links, nothing of their targets.
func TestWriteTarNeverFollowsLinks(t *testing.T) {
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
	n, err := WriteTar(context.Background(), dir, &buf)
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
