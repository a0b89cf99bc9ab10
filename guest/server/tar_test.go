package server_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/guesttest"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
)

// snapshot describes a directory tree: kind, mode, content hash or link target per path.
func snapshot(t testing.TB, root string) map[string]string {
	t.Helper()
	out := make(map[string]string)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out[rel] = "link " + target
		case fi.IsDir():
			out[rel] = fmt.Sprintf("dir %v", fi.Mode().Perm())
		case !fi.Mode().IsRegular():
			out[rel] = fmt.Sprintf("special %v", fi.Mode().Type())
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = fmt.Sprintf("file %v %x", fi.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSticky), sha256.Sum256(b))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return out
}

func diffSnapshots(got, want map[string]string) string {
	var lines []string
	for k, w := range want {
		if g, ok := got[k]; !ok {
			lines = append(lines, fmt.Sprintf("missing %s (%s)", k, w))
		} else if g != w {
			lines = append(lines, fmt.Sprintf("%s: got %s, want %s", k, g, w))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			lines = append(lines, fmt.Sprintf("extra %s (%s)", k, g))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func populate(t testing.TB, ws string) {
	t.Helper()
	writeTree(t, ws, map[string]string{
		"README.md":           "# hello\n",
		"src/main.go":         "package main\n",
		"src/deep/a/b/c.txt":  strings.Repeat("c", 100000),
		"bin/run.sh":          "#!/bin/sh\necho run\n",
		"empty/":              "",
		".hidden/config":      "x=1",
		"name with spaces.md": "spaces",
	})
	must(t, os.Chmod(filepath.Join(ws, "bin/run.sh"), 0o755))
	must(t, os.Chmod(filepath.Join(ws, "README.md"), 0o600))
	must(t, os.Chmod(filepath.Join(ws, "src/deep"), 0o750))
	must(t, os.Chmod(filepath.Join(ws, "src/main.go"), 0o644|fs.ModeSticky))
	must(t, os.Symlink("src/main.go", filepath.Join(ws, "main-link")))
	must(t, os.Symlink("../README.md", filepath.Join(ws, "src/readme-link")))
	must(t, os.Symlink("/workspace/src", filepath.Join(ws, "abs-inside")))
	must(t, os.Symlink("dangling-target", filepath.Join(ws, "dangling")))
	must(t, os.MkdirAll(filepath.Join(ws, "ro"), 0o755))
	must(t, os.WriteFile(filepath.Join(ws, "ro/file"), []byte("ro"), 0o444))
	must(t, os.Chmod(filepath.Join(ws, "ro"), 0o555))
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func export(t testing.TB, c *client.Client) []byte {
	t.Helper()
	rc, err := c.ExportWorkspace(guesttest.Ctx(t, 30*time.Second))
	if err != nil {
		t.Fatalf("ExportWorkspace: %v", err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("reading the export: %v", err)
	}
	return b
}

// tarNames lists the entry names of a tar stream, in order.
func tarNames(t testing.TB, tarball []byte) []string {
	t.Helper()
	var names []string
	tr := tar.NewReader(bytes.NewReader(tarball))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return names
		}
		must(t, err)
		names = append(names, hdr.Name)
	}
}

// forImportWriters runs an import test with the reading goroutine writing every file, and
// with two writers writing small files' content beside it (what the host's restore uses).
func forImportWriters(t *testing.T, test func(t *testing.T, o server.Options)) {
	for _, w := range []int{0, 2} {
		t.Run(fmt.Sprintf("writers=%d", w), func(t *testing.T) { test(t, server.Options{ImportWriters: w}) })
	}
}

func TestWorkspaceRoundTrip(t *testing.T) {
	forImportWriters(t, func(t *testing.T, o server.Options) {
		src := guesttest.New(t, o, guesttest.OverSocketpair)
		populate(t, src.WS)
		// A FIFO and a socket are skipped, a hard link becomes a regular file.
		must(t, exec("mkfifo", filepath.Join(src.WS, "fifo")))
		must(t, os.Link(filepath.Join(src.WS, "src/main.go"), filepath.Join(src.WS, "hardlink")))
		want := snapshot(t, src.WS)
		delete(want, "fifo")

		tarball := export(t, src.C)
		names := tarNames(t, tarball)
		if len(names) != len(want) {
			t.Errorf("tar entries: got %d (%v), want %d", len(names), names, len(want))
		}

		dst := guesttest.New(t, o, guesttest.OverNetPipe)
		writeTree(t, dst.WS, map[string]string{"old.txt": "old", "src/old.go": "old"})
		res, err := dst.C.ImportWorkspace(guesttest.Ctx(t, 30*time.Second), bytes.NewReader(tarball), client.ImportOptions{Replace: true})
		if err != nil {
			t.Fatalf("ImportWorkspace: %v", err)
		}
		if res.Files != int64(len(want)) {
			t.Errorf("import files: got %d, want %d", res.Files, len(want))
		}
		if d := diffSnapshots(snapshot(t, dst.WS), want); d != "" {
			t.Errorf("workspace after round trip:\n%s", d)
		}
		fi, err := os.Stat(filepath.Join(dst.WS, "src/deep/a/b/c.txt"))
		want0, _ := os.Stat(filepath.Join(src.WS, "src/deep/a/b/c.txt"))
		if err != nil || !fi.ModTime().Equal(want0.ModTime().Round(time.Second)) {
			t.Errorf("mtime: got %v, want %v", fi.ModTime(), want0.ModTime())
		}

		// Without replace, the tar is merged over what is there.
		writeTree(t, dst.WS, map[string]string{"extra/keep.txt": "keep"})
		must(t, os.WriteFile(filepath.Join(dst.WS, "README.md"), []byte("changed"), 0o644))
		if _, err := dst.C.ImportWorkspace(guesttest.Ctx(t, 30*time.Second), bytes.NewReader(tarball), client.ImportOptions{}); err != nil {
			t.Fatalf("ImportWorkspace merge: %v", err)
		}
		got := snapshot(t, dst.WS)
		if !strings.HasPrefix(got["extra/keep.txt"], "file") || got["README.md"] != want["README.md"] {
			t.Errorf("merge: got extra %q README %q, want kept and restored", got["extra/keep.txt"], got["README.md"])
		}
	})
}

// TestImportExternalSymlinks: a symlink out of the workspace is refused unless allowed.
func TestImportExternalSymlinks(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	tarball := buildTar(t, []tarEntry{
		{name: "venv/bin/", typ: tar.TypeDir},
		{name: "venv/bin/python", typ: tar.TypeSymlink, link: "/usr/bin/python3"},
		{name: "app.py", body: "print(1)"},
	})
	_, err := h.C.ImportWorkspace(ctx, bytes.NewReader(tarball), client.ImportOptions{Replace: true})
	wantCode(t, err, proto.ErrCodeInvalid)
	if _, err := h.C.ImportWorkspace(ctx, bytes.NewReader(tarball), client.ImportOptions{Replace: true, AllowExternalSymlinks: true}); err != nil {
		t.Fatalf("ImportWorkspace with external symlinks: %v", err)
	}
	if target, err := os.Readlink(filepath.Join(h.WS, "venv/bin/python")); err != nil || target != "/usr/bin/python3" {
		t.Errorf("venv link: got %q %v, want /usr/bin/python3", target, err)
	}
}

type tarEntry struct {
	name string
	typ  byte
	body string
	link string
	mode int64
	size int64 // overrides len(body) in the header
}

func buildTar(t testing.TB, entries []tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		hdr := &tar.Header{Name: e.name, Typeflag: typ, Linkname: e.link, Mode: mode, ModTime: time.Unix(1700000000, 0)}
		if typ == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if typ == tar.TypeChar || typ == tar.TypeBlock {
			hdr.Devmajor, hdr.Devminor = 1, 3
		}
		must(t, tw.WriteHeader(hdr))
		if typ == tar.TypeReg {
			_, err := io.WriteString(tw, e.body)
			must(t, err)
		}
	}
	must(t, tw.Close())
	return buf.Bytes()
}

func TestImportHostile(t *testing.T) {
	forImportWriters(t, func(t *testing.T, o server.Options) {
		h := guesttest.New(t, o, guesttest.OverSocketpair)
		populate(t, h.WS)
		before := snapshot(t, h.WS)
		outside := t.TempDir()
		must(t, os.WriteFile(filepath.Join(outside, "target"), []byte("outside"), 0o644))
		outsideBefore := snapshot(t, outside)
		rel := func(p string) string { r, _ := filepath.Rel(h.WS, p); return r }

		many := make([]tarEntry, 6)
		for i := range many {
			many[i] = tarEntry{name: fmt.Sprintf("f%d", i), body: "x"}
		}
		tests := []struct {
			name    string
			entries []tarEntry
			opts    client.ImportOptions
			code    string
		}{
			{"dotdot", []tarEntry{{name: "ok.txt", body: "ok"}, {name: "../evil", body: "evil"}}, client.ImportOptions{}, proto.ErrCodeInvalid},
			{"dotdot-inner", []tarEntry{{name: "a/../../evil", body: "evil"}}, client.ImportOptions{}, proto.ErrCodeInvalid},
			{"dotdot-to-outside", []tarEntry{{name: rel(filepath.Join(outside, "target")), body: "evil"}}, client.ImportOptions{}, proto.ErrCodeInvalid},
			{"absolute", []tarEntry{{name: "/tmp/evil-abs", body: "evil"}}, client.ImportOptions{}, proto.ErrCodeInvalid},
			{"symlink-to-etc-then-write", []tarEntry{
				{name: "etc", typ: tar.TypeSymlink, link: "/etc"},
				{name: "etc/evil", body: "evil"},
			}, client.ImportOptions{}, proto.ErrCodeInvalid},
			{"symlink-to-etc-then-write-allowed", []tarEntry{
				{name: "etc", typ: tar.TypeSymlink, link: "/etc"},
				{name: "etc/evil", body: "evil"},
			}, client.ImportOptions{AllowExternalSymlinks: true}, proto.ErrCodeInvalid},
			{"symlink-relative-out-then-write", []tarEntry{
				{name: "d/up", typ: tar.TypeSymlink, link: "../../" + filepath.Base(outside)},
				{name: "d/up/target", body: "evil"},
			}, client.ImportOptions{AllowExternalSymlinks: true}, proto.ErrCodeInvalid},
			{"symlink-relative-out", []tarEntry{{name: "d/up", typ: tar.TypeSymlink, link: "../../x"}}, client.ImportOptions{}, proto.ErrCodeInvalid},
			{"symlink-then-dir-through-it", []tarEntry{
				{name: "l", typ: tar.TypeSymlink, link: outside},
				{name: "l/sub/", typ: tar.TypeDir},
			}, client.ImportOptions{AllowExternalSymlinks: true}, proto.ErrCodeInvalid},
			{"hardlink-absolute", []tarEntry{{name: "h", typ: tar.TypeLink, link: filepath.Join(outside, "target")}}, client.ImportOptions{}, proto.ErrCodeInvalid},
			{"hardlink-dotdot", []tarEntry{{name: "h", typ: tar.TypeLink, link: "../" + rel(filepath.Join(outside, "target"))}}, client.ImportOptions{}, proto.ErrCodeInvalid},
			{"hardlink-through-symlink", []tarEntry{
				{name: "l", typ: tar.TypeSymlink, link: outside},
				{name: "h", typ: tar.TypeLink, link: "l/target"},
			}, client.ImportOptions{AllowExternalSymlinks: true}, proto.ErrCodeInvalid},
			{"below-a-symlink-inside", []tarEntry{
				{name: "d/", typ: tar.TypeDir},
				{name: "l", typ: tar.TypeSymlink, link: "d"},
				{name: "l/x", body: "through a link that stays inside"},
			}, client.ImportOptions{}, proto.ErrCodeInvalid},
			{"dir-over-symlink", []tarEntry{
				{name: "d/", typ: tar.TypeDir},
				{name: "l", typ: tar.TypeSymlink, link: "d"},
				{name: "l/", typ: tar.TypeDir},
			}, client.ImportOptions{}, proto.ErrCodeInvalid},
			{"hardlink-through-symlink-inside", []tarEntry{
				{name: "d/f", body: "x"},
				{name: "l", typ: tar.TypeSymlink, link: "d"},
				{name: "h", typ: tar.TypeLink, link: "l/f"},
			}, client.ImportOptions{}, proto.ErrCodeInvalid},
			{"hardlink-to-symlink", []tarEntry{
				{name: "a/b/l", typ: tar.TypeSymlink, link: "../../x"},
				{name: "h", typ: tar.TypeLink, link: "a/b/l"},
			}, client.ImportOptions{}, proto.ErrCodeInvalid},
			{"hardlink-to-dir", []tarEntry{{name: "d/", typ: tar.TypeDir}, {name: "h", typ: tar.TypeLink, link: "d"}}, client.ImportOptions{}, proto.ErrCodeInvalid},
			{"char-device", []tarEntry{{name: "null", typ: tar.TypeChar}}, client.ImportOptions{}, proto.ErrCodeInvalid},
			{"block-device", []tarEntry{{name: "sda", typ: tar.TypeBlock}}, client.ImportOptions{}, proto.ErrCodeInvalid},
			{"fifo", []tarEntry{{name: "pipe", typ: tar.TypeFifo}}, client.ImportOptions{}, proto.ErrCodeInvalid},
			{"too-many-files", many, client.ImportOptions{MaxFiles: 5}, proto.ErrCodeTooLarge},
			{"too-many-bytes", []tarEntry{{name: "a", body: strings.Repeat("a", 60)}, {name: "b", body: strings.Repeat("b", 60)}},
				client.ImportOptions{MaxBytes: 100}, proto.ErrCodeTooLarge},
			{"replaces-dir-with-file", []tarEntry{{name: "d/", typ: tar.TypeDir}, {name: "d", body: "x"}}, client.ImportOptions{}, proto.ErrCodeInvalid},
			{"long-component", []tarEntry{{name: "a/" + strings.Repeat("n", 256), body: "x"}}, client.ImportOptions{}, proto.ErrCodeInvalid},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				tt.opts.Replace = true
				_, err := h.C.ImportWorkspace(guesttest.Ctx(t, 30*time.Second), bytes.NewReader(buildTar(t, tt.entries)), tt.opts)
				wantCode(t, err, tt.code)
				if d := diffSnapshots(snapshot(t, h.WS), before); d != "" {
					t.Errorf("workspace changed:\n%s", d)
				}
				if d := diffSnapshots(snapshot(t, outside), outsideBefore); d != "" {
					t.Errorf("outside changed:\n%s", d)
				}
				for _, p := range []string{"/etc/evil", "/tmp/evil-abs", filepath.Join(filepath.Dir(h.WS), "evil")} {
					if _, err := os.Lstat(p); err == nil {
						os.Remove(p)
						t.Errorf("%s was created", p)
					}
				}
			})
		}
		// A garbage body is a bad tar, nothing more.
		_, err := h.C.ImportWorkspace(guesttest.Ctx(t, 30*time.Second), strings.NewReader(strings.Repeat("garbage!", 200)), client.ImportOptions{Replace: true})
		wantCode(t, err, proto.ErrCodeInvalid)
		if d := diffSnapshots(snapshot(t, h.WS), before); d != "" {
			t.Errorf("workspace changed by garbage:\n%s", d)
		}
	})
}

// failingReader yields r, then fails: a caller's hash check that aborts the request.
type failingReader struct {
	r    io.Reader
	fail error
}

func (f *failingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, f.fail
	}
	return n, err
}

func TestImportAbortedMidway(t *testing.T) {
	forImportWriters(t, func(t *testing.T, o server.Options) {
		h := guesttest.New(t, o, guesttest.OverSocketpair)
		populate(t, h.WS)
		before := snapshot(t, h.WS)
		big := make([]tarEntry, 0, 50)
		for i := range 50 {
			big = append(big, tarEntry{name: fmt.Sprintf("new/f%d", i), body: strings.Repeat("z", 50000)})
		}
		tarball := buildTar(t, big)
		errHash := errors.New("sha256 mismatch")
		tests := []struct {
			name string
			body io.Reader
		}{
			{"midway", &failingReader{r: bytes.NewReader(tarball[:len(tarball)/2]), fail: errHash}},
			{"at-the-end", &failingReader{r: bytes.NewReader(tarball), fail: errHash}},
			{"truncated-inside-a-file", bytes.NewReader(tarball[:len(tarball)/2+100])},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				_, err := h.C.ImportWorkspace(guesttest.Ctx(t, 30*time.Second), tt.body, client.ImportOptions{Replace: true})
				if err == nil {
					t.Fatal("ImportWorkspace: got no error, want one")
				}
				// The server cleans its staging folder after answering.
				waitFor(t, func() bool {
					m, _ := filepath.Glob(filepath.Join(h.WS, ".sbx-import-*"))
					return len(m) == 0
				})
				if d := diffSnapshots(snapshot(t, h.WS), before); d != "" {
					t.Errorf("workspace changed:\n%s", d)
				}
			})
		}
		// The same stream, whole, goes in.
		res, err := h.C.ImportWorkspace(guesttest.Ctx(t, 30*time.Second), bytes.NewReader(tarball), client.ImportOptions{})
		if err != nil || res.Files != 50 || res.Bytes != 50*50000 {
			t.Fatalf("ImportWorkspace: got %+v %v, want 50 files", res, err)
		}
	})
}

func exec(name string, args ...string) error {
	p, err := os.StartProcess(lookPath(name), append([]string{name}, args...), &os.ProcAttr{Files: []*os.File{nil, os.Stderr, os.Stderr}})
	if err != nil {
		return err
	}
	st, err := p.Wait()
	if err != nil {
		return err
	}
	if !st.Success() {
		return fmt.Errorf("%s: %v", name, st)
	}
	return nil
}

func lookPath(name string) string {
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if p := filepath.Join(dir, name); fileExists(p) {
			return p
		}
	}
	return name
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestImportLaterEntriesReplaceEarlierOnes: a file given twice ends with its last content; a
// file over an earlier symlink replaces the link and never writes through it.
func TestImportLaterEntriesReplaceEarlierOnes(t *testing.T) {
	forImportWriters(t, func(t *testing.T, o server.Options) {
		h := guesttest.New(t, o, guesttest.OverSocketpair)
		ctx := guesttest.Ctx(t, 30*time.Second)
		must(t, os.WriteFile(filepath.Join(h.WS, "outside-target"), []byte("untouched"), 0o644))
		tarball := buildTar(t, []tarEntry{
			{name: "a/b/same.txt", body: "first"},
			{name: "a/b/same.txt", body: "second"},
			{name: "a/link", typ: tar.TypeSymlink, link: "../outside-target"},
			{name: "a/link", body: "a file now"},
		})
		if _, err := h.C.ImportWorkspace(ctx, bytes.NewReader(tarball), client.ImportOptions{}); err != nil {
			t.Fatalf("ImportWorkspace: %v", err)
		}
		for p, want := range map[string]string{"a/b/same.txt": "second", "a/link": "a file now", "outside-target": "untouched"} {
			got, err := os.ReadFile(filepath.Join(h.WS, p))
			if err != nil || string(got) != want {
				t.Errorf("%s: got %q %v, want %q", p, got, err, want)
			}
		}
		if fi, err := os.Lstat(filepath.Join(h.WS, "a/link")); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("a/link: got %v %v, want a regular file", fi, err)
		}
	})
}

// TestReservedLookAlikesSurvive: names a command makes that start like the server's own
// (.sbx-tmp-notes, .sbx-import-x/y) are exported, imported and kept across a server start;
// only names of exactly the server's form are left out of exports, refused by imports and, for
// staging folders at the top, deleted at start.
func TestReservedLookAlikesSurvive(t *testing.T) {
	ws := t.TempDir()
	writeTree(t, ws, map[string]string{
		".sbx-tmp-notes":        "notes",
		".sbx-import-x/y":       "y",
		ownImport + "/staged":   "left by an import cut short",
		"sub/" + ownTmp:         "a write in flight",
		"sub/" + ownImport:      "not at the top: an ordinary file",
		"sub/.sbx-tmp-deadbeef": "too short to be the server's",
	})
	// A server starting on the workspace removes only its own staging folders.
	srv, err := server.New(server.Options{Workspace: ws, StateDir: guesttest.TmpfsDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	for _, name := range []string{".sbx-tmp-notes", ".sbx-import-x/y", "sub/" + ownTmp, "sub/" + ownImport} {
		if !fileExists(filepath.Join(ws, name)) {
			t.Errorf("%s was deleted at start, want it kept", name)
		}
	}
	if fileExists(filepath.Join(ws, ownImport)) {
		t.Errorf("the stale staging folder %s was kept", ownImport)
	}

	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	must(t, os.RemoveAll(h.WS))
	must(t, os.Rename(ws, h.WS))
	tarball := export(t, h.C)
	got := tarNames(t, tarball)
	sort.Strings(got)
	want := []string{".sbx-import-x/", ".sbx-import-x/y", ".sbx-tmp-notes", "sub/", "sub/" + ownImport, "sub/.sbx-tmp-deadbeef"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("export: got %v, want %v", got, want)
	}

	// The export goes back in whole (a restore), into a fresh workspace.
	dst := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	if _, err := dst.C.ImportWorkspace(guesttest.Ctx(t, 30*time.Second), bytes.NewReader(tarball), client.ImportOptions{Replace: true}); err != nil {
		t.Fatalf("ImportWorkspace: %v", err)
	}
	for _, name := range []string{".sbx-tmp-notes", ".sbx-import-x/y", "sub/" + ownImport} {
		if !fileExists(filepath.Join(dst.WS, name)) {
			t.Errorf("%s missing after the import", name)
		}
	}

	// A tar naming one of the server's own forms is refused, not silently hidden.
	for _, name := range []string{ownTmp, "a/" + ownTmp, ownImport + "/f"} {
		_, err := dst.C.ImportWorkspace(guesttest.Ctx(t, 30*time.Second), bytes.NewReader(buildTar(t, []tarEntry{{name: name, body: "x"}})), client.ImportOptions{})
		wantCode(t, err, proto.ErrCodeInvalid)
	}
}
