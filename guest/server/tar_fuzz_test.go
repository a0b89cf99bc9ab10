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
	"time"

	"sandboxd/guest/proto"
)

// Import flags of FuzzImportTar (its flags byte).
const (
	fzReplace       = 1 << 0
	fzExternalLinks = 1 << 1
)

// FuzzImportTar feeds a tar stream from fuzz data to the workspace import (PUT
// /v1/workspace/tar) of a workspace that sits beside a sibling folder "outside", and holds
// symlinks to it (relative, absolute, and one through /workspace). Whatever the stream, the
// import never panics, answers 200 or a protocol error, never changes anything outside the
// workspace (the parent folder and the sibling stay as they were: through no symlink, by no
// hard link), leaves no staging folder behind, and, unless external symlinks are allowed,
// creates no symlink that points lexically out of the workspace.
func FuzzImportTar(f *testing.F) {
	type e = fzEnt
	seeds := []struct {
		flags uint8
		ents  []fzEnt
	}{
		{0, []e{{name: "a/", typ: tar.TypeDir}, {name: "a/f", body: "x"}, {name: "a/l", typ: tar.TypeSymlink, link: "f"}}},
		{fzReplace, []e{{name: "./top", body: "hi"}, {name: "d/", typ: tar.TypeDir, mode: 0o500}, {name: "d/x", body: "y"}}},
		{0, []e{{name: "../x", body: "escape"}}},
		{0, []e{{name: "/etc/x", body: "escape"}}},
		{0, []e{{name: "a/../../outside/x", body: "escape"}}},
		{0, []e{{name: "evil/x", body: "through a link to the sibling"}}},
		{fzReplace, []e{{name: "abs/x", body: "through an absolute link"}}},
		{0, []e{{name: "wslink/x", body: "through /workspace"}}},
		{0, []e{{name: "evil/", typ: tar.TypeDir}, {name: "evil/canary", body: "overwrite"}}},
		{0, []e{{name: "l", typ: tar.TypeSymlink, link: "../outside"}, {name: "l/x", body: "y"}}},
		{fzExternalLinks, []e{{name: "l", typ: tar.TypeSymlink, link: "../outside"}, {name: "l/x", body: "y"}}},
		{fzExternalLinks, []e{{name: "l", typ: tar.TypeSymlink, link: "/"}, {name: "l/tmp/x", body: "y"}}},
		{fzExternalLinks | fzReplace, []e{{name: "l", typ: tar.TypeSymlink, link: "../outside"}, {name: "h", typ: tar.TypeLink, link: "l/canary"}}},
		{0, []e{{name: "h", typ: tar.TypeLink, link: "../outside/canary"}}},
		{0, []e{{name: "h", typ: tar.TypeLink, link: "evil/canary"}}},
		{0, []e{{name: "a/b/l", typ: tar.TypeSymlink, link: "../../x"}, {name: "h", typ: tar.TypeLink, link: "a/b/l"}}},
		{0, []e{{name: "a/l1", typ: tar.TypeSymlink, link: ".."}, {name: "a/l2", typ: tar.TypeSymlink, link: "l1/../outside"}, {name: "a/l2/x", body: "y"}}},
		{0, []e{{name: "l", typ: tar.TypeSymlink, link: "a"}, {name: "a", typ: tar.TypeSymlink, link: "l"}, {name: "l/x", body: "loop"}}},
		{0, []e{{name: "f", body: "file"}, {name: "f/x", body: "below a file"}}},
		{0, []e{{name: "d/", typ: tar.TypeDir}, {name: "d", body: "replaces a dir"}}},
		{0, []e{{name: "f", body: "1"}, {name: "f", body: "22"}, {name: "f", typ: tar.TypeSymlink, link: "../outside/canary"}}},
		{0, []e{{name: ".", typ: tar.TypeDir}, {name: "./", typ: tar.TypeDir}, {name: ".", body: "root"}}},
		{0, []e{{name: ".sbx-import-0123456789abcdef/x", body: "reserved"}}},
		{0, []e{{name: "a/.sbx-tmp-0123456789abcdef", body: "reserved"}}},
		{0, []e{{name: "dev", typ: tar.TypeChar}, {name: "fifo", typ: tar.TypeFifo}}},
		{0, []e{{name: strings.Repeat("n", 300), body: "long"}}},
		{0, []e{{name: "big", body: strings.Repeat("z", 70000)}}},
	}
	for _, s := range seeds {
		f.Add(s.flags, fzTar(f, s.ents))
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
	f.Add(uint8(0), fzTar(f, []fzEnt{{name: "a", body: "xyz"}})[:700])
	f.Add(uint8(0), []byte("not a tar at all"))

	logger := slog.New(slog.DiscardHandler)
	f.Fuzz(func(t *testing.T, flags uint8, data []byte) {
		if len(data) > 256<<10 {
			return
		}
		parent := fzTempDir(t)
		ws, outside := filepath.Join(parent, "ws"), filepath.Join(parent, "outside")
		fzLayout(t, ws, outside)
		before := fzSnapshot(t, parent, "ws")
		s := &Server{ws: ws, log: logger}

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
		for _, n := range names {
			if strings.HasPrefix(n.Name(), importPrefix) {
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
			if s.linkEscapes(name, target) {
				t.Fatalf("the import created the symlink %s -> %s, which points out of the workspace", name, target)
			}
		}
	})
}

// fzTempDir is a fresh folder removed when t ends: on a tmpfs when there is one (an import on
// a disk file system costs milliseconds in unlinks and renames; on tmpfs a few microseconds).
func fzTempDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("/dev/shm", "sbx-fuzz-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// fzEnt is an entry of a seed tar; typ 0 is a regular file.
type fzEnt struct {
	name, body, link string
	typ              byte
	mode             int64
}

func fzTar(tb testing.TB, ents []fzEnt) []byte {
	tb.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, ModTime: time.Unix(1700000000, 0)}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			tb.Fatalf("tar header %q: %v", e.name, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	return b.Bytes()
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
