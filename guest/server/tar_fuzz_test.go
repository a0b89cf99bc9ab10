package server

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sandboxd/guest/proto"
	"sandboxd/internal/tarsafe/tarsafetest"
)

// Import flags of FuzzImportTar (its flags byte).
const (
	fzReplace       = 1 << 0
	fzExternalLinks = 1 << 1
	fzWriters       = 1 << 2 // two goroutines write small files' content (Options.ImportWriters)
)

// FuzzImportTar feeds a tar stream from fuzz data to the workspace import (PUT
// /v1/workspace/tar) of a workspace that sits beside a sibling folder "outside", and holds
// symlinks to it (relative, absolute, and one through /workspace). Whatever the stream, the
// import never panics, answers 200 or a protocol error, never changes anything outside the
// workspace (the parent folder and the sibling stay as they were: through no symlink, by no
// hard link), leaves no staging folder behind, and, unless external symlinks are allowed,
// creates no symlink that points lexically out of the workspace.
func FuzzImportTar(f *testing.F) {
	type e = tarsafetest.Ent
	seeds := []struct {
		flags uint8
		ents  []tarsafetest.Ent
	}{
		{0, []e{{Name: "a/", Typ: tar.TypeDir}, {Name: "a/f", Body: "x"}, {Name: "a/l", Typ: tar.TypeSymlink, Link: "f"}}},
		{fzReplace, []e{{Name: "./top", Body: "hi"}, {Name: "d/", Typ: tar.TypeDir, Mode: 0o500}, {Name: "d/x", Body: "y"}}},
		{0, []e{{Name: "../x", Body: "escape"}}},
		{0, []e{{Name: "/etc/x", Body: "escape"}}},
		{0, []e{{Name: "a/../../outside/x", Body: "escape"}}},
		{0, []e{{Name: "evil/x", Body: "through a link to the sibling"}}},
		{fzReplace, []e{{Name: "abs/x", Body: "through an absolute link"}}},
		{0, []e{{Name: "wslink/x", Body: "through /workspace"}}},
		{0, []e{{Name: "evil/", Typ: tar.TypeDir}, {Name: "evil/canary", Body: "overwrite"}}},
		{0, []e{{Name: "l", Typ: tar.TypeSymlink, Link: "../outside"}, {Name: "l/x", Body: "y"}}},
		{fzExternalLinks, []e{{Name: "l", Typ: tar.TypeSymlink, Link: "../outside"}, {Name: "l/x", Body: "y"}}},
		{fzExternalLinks, []e{{Name: "l", Typ: tar.TypeSymlink, Link: "/"}, {Name: "l/tmp/x", Body: "y"}}},
		{fzExternalLinks | fzReplace, []e{{Name: "l", Typ: tar.TypeSymlink, Link: "../outside"}, {Name: "h", Typ: tar.TypeLink, Link: "l/canary"}}},
		{0, []e{{Name: "h", Typ: tar.TypeLink, Link: "../outside/canary"}}},
		{0, []e{{Name: "h", Typ: tar.TypeLink, Link: "evil/canary"}}},
		{0, []e{{Name: "a/b/l", Typ: tar.TypeSymlink, Link: "../../x"}, {Name: "h", Typ: tar.TypeLink, Link: "a/b/l"}}},
		{0, []e{{Name: "a/l1", Typ: tar.TypeSymlink, Link: ".."}, {Name: "a/l2", Typ: tar.TypeSymlink, Link: "l1/../outside"}, {Name: "a/l2/x", Body: "y"}}},
		{0, []e{{Name: "l", Typ: tar.TypeSymlink, Link: "a"}, {Name: "a", Typ: tar.TypeSymlink, Link: "l"}, {Name: "l/x", Body: "loop"}}},
		{0, []e{{Name: "f", Body: "file"}, {Name: "f/x", Body: "below a file"}}},
		{0, []e{{Name: "d/", Typ: tar.TypeDir}, {Name: "d", Body: "replaces a dir"}}},
		{0, []e{{Name: "f", Body: "1"}, {Name: "f", Body: "22"}, {Name: "f", Typ: tar.TypeSymlink, Link: "../outside/canary"}}},
		{0, []e{{Name: ".", Typ: tar.TypeDir}, {Name: "./", Typ: tar.TypeDir}, {Name: ".", Body: "root"}}},
		{0, []e{{Name: ".sbx-import-0123456789abcdef/x", Body: "reserved"}}},
		{0, []e{{Name: "a/.sbx-tmp-0123456789abcdef", Body: "reserved"}}},
		{0, []e{{Name: "dev", Typ: tar.TypeChar}, {Name: "fifo", Typ: tar.TypeFifo}}},
		{0, []e{{Name: strings.Repeat("n", 300), Body: "long"}}},
		{0, []e{{Name: "big", Body: strings.Repeat("z", 70000)}}},
		{fzWriters, []e{{Name: "f", Body: "1"}, {Name: "f", Body: "22"}, {Name: "h", Typ: tar.TypeLink, Link: "f"}, {Name: "f", Typ: tar.TypeSymlink, Link: "../outside/canary"}}},
		{fzWriters | fzReplace, []e{{Name: "a/", Typ: tar.TypeDir, Mode: 0o500}, {Name: "a/f", Body: "x"}, {Name: "big", Body: strings.Repeat("z", 300000)}, {Name: "evil/x", Body: "y"}}},
		{fzWriters, []e{{Name: "h", Typ: tar.TypeLink, Link: "evil/canary"}, {Name: "f/x", Body: "below a file"}}},
	}
	for _, s := range seeds {
		f.Add(s.flags, tarsafetest.Tar(f, s.ents))
	}
	// Raw streams: a PAX path escape, a truncated header, garbage.
	var pax bytes.Buffer
	tw := tar.NewWriter(&pax)
	_ = tw.WriteHeader(&tar.Header{Name: "ok", Typeflag: tar.TypeReg, Format: tar.FormatPAX,
		PAXRecords: map[string]string{"path": "../../outside/pax"}})
	_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, PAXRecords: map[string]string{"path": "../global"}})
	_ = tw.WriteHeader(&tar.Header{Name: "after-global", Typeflag: tar.TypeReg})
	_ = tw.Close()
	f.Add(uint8(0), pax.Bytes())
	f.Add(uint8(0), tarsafetest.Tar(f, []tarsafetest.Ent{{Name: "a", Body: "xyz"}})[:700])
	f.Add(uint8(0), []byte("not a tar at all"))

	logger := slog.New(slog.DiscardHandler)
	f.Fuzz(func(t *testing.T, flags uint8, data []byte) {
		if len(data) > 256<<10 {
			return
		}
		parent := tarsafetest.TempDir(t)
		ws, outside := filepath.Join(parent, "ws"), filepath.Join(parent, "outside")
		fzLayout(t, ws, outside)
		before := fzSnapshot(t, parent, "ws")
		s := &Server{ws: ws, log: logger}
		if flags&fzWriters != 0 {
			s.opts.ImportWriters = 2
		}

		q := "max_bytes=131072&max_files=64"
		if flags&fzReplace != 0 {
			q += "&replace=1"
		}
		external := flags&fzExternalLinks != 0
		if external {
			q += "&external_symlinks=1"
		}
		links := fzLinks(t, ws)
		rec := httptest.NewRecorder()
		s.handleImport(rec, httptest.NewRequest(http.MethodPut, "/v1/workspace/tar?"+q, bytes.NewReader(data)))

		if after := fzSnapshot(t, parent, "ws"); after != before {
			t.Fatalf("the import changed what lies outside the workspace:\nbefore:\n%s\nafter:\n%s", before, after)
		}
		names, err := os.ReadDir(ws)
		if err != nil {
			t.Fatal(err)
		}
		// Only names of the server's own form are staging folders: a tar may carry a folder
		// such as .sbx-import-0123456789a (not 16 hex digits), which is kept like any other.
		for _, n := range names {
			if isOwnName(n.Name(), importPrefix) {
				t.Fatalf("the import left its staging folder %s behind", n.Name())
			}
		}
		if rec.Code != http.StatusOK {
			var e proto.Error
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Code == "" || e.Message == "" {
				t.Fatalf("got status %d with %q, want a protocol error", rec.Code, rec.Body)
			}
			if proto.HTTPStatus(e.Code) != rec.Code {
				t.Fatalf("got status %d for code %s, want %d", rec.Code, e.Code, proto.HTTPStatus(e.Code))
			}
			if e.Code == proto.ErrCodeInternal {
				t.Fatalf("got an internal error for a client's tar: %s", e.Message)
			}
			return
		}
		var res proto.ImportResult
		if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil {
			t.Fatalf("got 200 with %q: %v", rec.Body, err)
		}
		if res.Bytes > 131072 || res.Files > 64 {
			t.Fatalf("imported %+v, over the limits of 131072 bytes and 64 files", res)
		}
		if external {
			return
		}
		for name, target := range fzLinks(t, ws) {
			if links[name] == target {
				continue // the workspace's own
			}
			if linkEscapes(s.ws, name, target) {
				t.Fatalf("the import created the symlink %s -> %s, which points out of the workspace", name, target)
			}
		}
	})
}

// fzLayout makes a workspace ws beside a sibling folder outside, with symlinks to outside (a
// relative one, an absolute one, one through a subfolder) and one through /workspace.
func fzLayout(t *testing.T, ws, outside string) {
	t.Helper()
	for _, d := range []string{filepath.Join(ws, "sub", "deeper"), filepath.Join(outside, "dir")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for p, body := range map[string]string{
		filepath.Join(outside, "canary"):        "canary",
		filepath.Join(outside, "dir", "canary"): "canary",
		filepath.Join(ws, "keep"):               "keep",
	} {
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, target := range map[string]string{
		"evil":          "../outside",
		"abs":           outside,
		"wslink":        proto.Workspace + "/sub",
		"sub/up":        "../../outside/dir",
		"sub/deeper/up": "../../../outside",
		"canary":        "../outside/canary",
	} {
		if err := os.Symlink(target, filepath.Join(ws, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// fzSnapshot describes the tree under dir (never following a symlink), leaving out the
// entry skip of dir itself: kind, mode, modification time, content hash or link target.
func fzSnapshot(t *testing.T, dir, skip string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == skip {
			return filepath.SkipDir
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %v %d", rel, fi.Mode(), fi.ModTime().UnixNano())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			fmt.Fprintf(&b, " -> %s", target)
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %x", sha256.Sum256(data))
		}
		b.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot of %s: %v", dir, err)
	}
	return b.String()
}

// fzLinks maps every symlink under ws (by its path relative to ws) to its target.
func fzLinks(t *testing.T, ws string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(ws, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(ws, p)
			out[filepath.ToSlash(rel)] = target
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", ws, err)
	}
	return out
}
