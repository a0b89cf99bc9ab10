package server_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/guesttest"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
)

func TestFiles(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)

	fi, err := h.C.WriteFile(ctx, "a/b/c.txt", 0o640, strings.NewReader("hello"))
	if err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if fi.Path != "/workspace/a/b/c.txt" || fi.Name != "c.txt" || fi.Size != 5 || fi.Mode != 0o640 || fi.IsDir {
		t.Errorf("WriteFile: got %+v, want /workspace/a/b/c.txt, 5 bytes, 0640", fi)
	}
	st, err := os.Stat(filepath.Join(h.WS, "a/b/c.txt"))
	if err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("on disk: got %v %v, want 0640", st.Mode(), err)
	}
	// Overwrite through the absolute form, with setuid kept.
	if _, err := h.C.WriteFile(ctx, "/workspace/a/b/c.txt", 0o4755, strings.NewReader("hello again")); err != nil {
		t.Fatalf("WriteFile absolute: %v", err)
	}
	rc, fi, err := h.C.ReadFile(ctx, "a/b/c.txt")
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(b) != "hello again" {
		t.Fatalf("ReadFile: got %q %v, want hello again", b, err)
	}
	if fi.Size != 11 || fi.Mode != 0o4755 || fi.Path != "/workspace/a/b/c.txt" || fi.ModTime.IsZero() {
		t.Errorf("ReadFile info: got %+v, want 11 bytes, mode 4755", fi)
	}
	// The host path of the workspace is accepted as well.
	if rc, _, err := h.C.ReadFile(ctx, filepath.Join(h.WS, "a/b/c.txt")); err != nil {
		t.Errorf("ReadFile by host path: %v", err)
	} else {
		rc.Close()
	}
	if _, err := h.C.WriteFile(ctx, "empty", 0o600, strings.NewReader("")); err != nil {
		t.Fatalf("WriteFile empty: %v", err)
	}
	if err := os.Symlink("a/b/c.txt", filepath.Join(h.WS, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(h.WS, "emptydir"), 0o755); err != nil {
		t.Fatal(err)
	}

	entries, truncated, err := h.C.ListDir(ctx, "", 0)
	if err != nil {
		t.Fatalf("ListDir: %v", err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name)
		if e.Name == "link" && e.Symlink != "a/b/c.txt" {
			t.Errorf("symlink entry: got %+v, want target a/b/c.txt", e)
		}
		if e.Name == "a" && (!e.IsDir || e.Path != "a") {
			t.Errorf("dir entry: got %+v, want a directory with path a", e)
		}
	}
	if got := strings.Join(names, ","); got != "a,empty,emptydir,link" || truncated {
		t.Errorf("ListDir: got %s truncated=%v, want a,empty,emptydir,link", got, truncated)
	}
	entries, truncated, err = h.C.ListDir(ctx, "/workspace", 2)
	if err != nil || len(entries) != 2 || !truncated {
		t.Errorf("ListDir limit 2: got %d entries truncated=%v %v, want 2 and truncated", len(entries), truncated, err)
	}
	entries, _, err = h.C.ListDir(ctx, "a/b", 0)
	if err != nil || len(entries) != 1 || entries[0].Path != "a/b/c.txt" {
		t.Errorf("ListDir a/b: got %+v %v, want c.txt at a/b/c.txt", entries, err)
	}

	errTests := []struct {
		name string
		call func() error
		code string
	}{
		{"read-missing", func() error { _, _, err := h.C.ReadFile(ctx, "nope"); return err }, proto.ErrCodeNotFound},
		{"read-dir", func() error { _, _, err := h.C.ReadFile(ctx, "a"); return err }, proto.ErrCodeIsDir},
		{"read-empty-path", func() error { _, _, err := h.C.ReadFile(ctx, ""); return err }, proto.ErrCodeInvalid},
		{"list-file", func() error { _, _, err := h.C.ListDir(ctx, "empty", 0); return err }, proto.ErrCodeNotDir},
		{"list-missing", func() error { _, _, err := h.C.ListDir(ctx, "nope", 0); return err }, proto.ErrCodeNotFound},
		{"write-over-dir", func() error { _, err := h.C.WriteFile(ctx, "a", 0o644, strings.NewReader("x")); return err }, proto.ErrCodeIsDir},
		{"write-under-file", func() error {
			_, err := h.C.WriteFile(ctx, "empty/x", 0o644, strings.NewReader("x"))
			return err
		}, proto.ErrCodeNotDir},
		{"remove-missing", func() error { return h.C.Remove(ctx, "nope", false) }, proto.ErrCodeNotFound},
		{"remove-nonempty", func() error { return h.C.Remove(ctx, "a", false) }, proto.ErrCodeNotEmpty},
		{"remove-workspace", func() error { return h.C.Remove(ctx, "/workspace", true) }, proto.ErrCodeInvalid},
	}
	for _, tt := range errTests {
		t.Run(tt.name, func(t *testing.T) { wantCode(t, tt.call(), tt.code) })
	}

	if err := h.C.Remove(ctx, "emptydir", false); err != nil {
		t.Errorf("Remove empty dir: %v", err)
	}
	if err := h.C.Remove(ctx, "link", false); err != nil {
		t.Errorf("Remove symlink: %v", err)
	}
	if _, err := os.Stat(filepath.Join(h.WS, "a/b/c.txt")); err != nil {
		t.Errorf("removing a symlink removed its target: %v", err)
	}
	if err := h.C.Remove(ctx, "a", true); err != nil {
		t.Errorf("Remove recursive: %v", err)
	}
	if _, err := os.Stat(filepath.Join(h.WS, "a")); !os.IsNotExist(err) {
		t.Errorf("after recursive remove: got %v, want gone", err)
	}
	leftovers, _ := filepath.Glob(filepath.Join(h.WS, ".sbx-tmp-*"))
	if len(leftovers) > 0 {
		t.Errorf("temp files left: %v", leftovers)
	}
}

// TestFilesEscapes: nothing outside the workspace is read, written, listed or removed,
// whether by .. or through symlinks.
func TestFilesEscapes(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{
		"abs":      outside,                      // absolute symlink out
		"rel":      "../../../../../../../../..", // relative symlink out
		"etc":      "/etc",
		"sneaky/x": "../../" + filepath.Base(h.WS) + "/../", // in, then out
	} {
		p := filepath.Join(h.WS, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	paths := []string{
		"../secret",
		"a/../../secret",
		secret,
		"/etc/passwd",
		"/workspace/../etc/passwd",
		"abs/secret",
		"rel" + secret,
		"etc/passwd",
		"etc/hostname",
		"sneaky/x/secret",
	}
	for _, p := range paths {
		t.Run(strings.ReplaceAll(p, "/", "_"), func(t *testing.T) {
			_, _, err := h.C.ReadFile(ctx, p)
			wantCode(t, err, proto.ErrCodeInvalid)
			_, err = h.C.WriteFile(ctx, p+"-new", 0o644, strings.NewReader("pwned"))
			wantCode(t, err, proto.ErrCodeInvalid)
			_, _, err = h.C.ListDir(ctx, filepath.Dir(p), 0)
			if filepath.Dir(p) != "." && filepath.Dir(p) != "a/.." {
				wantCode(t, err, proto.ErrCodeInvalid)
			}
			err = h.C.Remove(ctx, p, true)
			wantCode(t, err, proto.ErrCodeInvalid)
		})
	}
	if b, err := os.ReadFile(secret); err != nil || string(b) != "secret" {
		t.Errorf("outside file: got %q %v, want it untouched", b, err)
	}
	ents, _ := os.ReadDir(outside)
	if len(ents) != 1 {
		t.Errorf("outside dir: got %d entries, want only the secret", len(ents))
	}
	if _, err := os.Stat("/etc/passwd-new"); err == nil {
		t.Errorf("/etc/passwd-new was created")
	}
	// Writing a file named like a symlink replaces the link, never writes through it.
	if _, err := h.C.WriteFile(ctx, "abs", 0o644, strings.NewReader("replaced")); err != nil {
		t.Fatalf("WriteFile over a symlink: %v", err)
	}
	if fi, err := os.Lstat(filepath.Join(h.WS, "abs")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("abs: got %v %v, want a regular file", fi, err)
	}
}

// TestFilesThroughLinks: symlinks that stay inside the workspace are followed like the kernel
// does (the last component only where the operation follows it).
func TestFilesThroughLinks(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	writeTree(t, h.WS, map[string]string{"real/sub/f.txt": "inside"})
	for name, target := range map[string]string{
		"ldir":      "real",
		"labs":      "/workspace/real/sub",
		"real/back": "../real/sub/f.txt",
	} {
		must(t, os.Symlink(target, filepath.Join(h.WS, name)))
	}
	for _, p := range []string{"ldir/sub/f.txt", "labs/f.txt", "real/back", "/workspace/ldir/sub/../sub/f.txt"} {
		rc, fi, err := h.C.ReadFile(ctx, p)
		if err != nil {
			t.Errorf("ReadFile(%s): %v", p, err)
			continue
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != "inside" || fi.Size != 6 {
			t.Errorf("ReadFile(%s): got %q, want inside", p, b)
		}
	}
	if _, err := h.C.WriteFile(ctx, "ldir/new.txt", 0o600, strings.NewReader("new")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(h.WS, "real/new.txt")); err != nil || string(b) != "new" {
		t.Errorf("write through a directory link: got %q %v, want real/new.txt", b, err)
	}
	entries, _, err := h.C.ListDir(ctx, "labs", 0)
	if err != nil || len(entries) != 1 || entries[0].Path != "labs/f.txt" {
		t.Errorf("ListDir(labs): got %+v %v, want f.txt", entries, err)
	}
	if err := h.C.Remove(ctx, "ldir", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(h.WS, "real/sub/f.txt")); err != nil {
		t.Errorf("removing a link removed what it points to: %v", err)
	}
}

// TestWriteFileMax uses the handler directly to exercise the max bound.
func TestWriteFileMax(t *testing.T) {
	ws := t.TempDir()
	srv, err := server.New(server.Options{Workspace: ws, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	tests := []struct {
		name   string
		url    string
		body   string
		length int64
		status int
	}{
		{"under", "/v1/files?path=f1&max=10", "0123456789", 10, http.StatusOK},
		{"over-declared", "/v1/files?path=f2&max=10", "0123456789a", 11, http.StatusRequestEntityTooLarge},
		{"over-streamed", "/v1/files?path=f3&max=10", "0123456789a", -1, http.StatusRequestEntityTooLarge},
		{"bad-mode", "/v1/files?path=f4&mode=999", "x", 1, http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPut, tt.url, strings.NewReader(tt.body))
			req.ContentLength = tt.length
			w := httptest.NewRecorder()
			srv.Handler().ServeHTTP(w, req)
			if w.Code != tt.status {
				t.Fatalf("status: got %d (%s), want %d", w.Code, w.Body, tt.status)
			}
		})
	}
	ents, _ := os.ReadDir(ws)
	if len(ents) != 1 || ents[0].Name() != "f1" {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("workspace: got %v, want only f1", names)
	}
}

// Names of exactly the form the server makes for itself (a reserved prefix and 16 lowercase hex
// digits), and names a command may make that merely look like them.
const (
	ownTmp    = ".sbx-tmp-0123456789abcdef"
	ownImport = ".sbx-import-fedcba9876543210"
)

// TestReservedNames: the files API refuses every path with a reserved component, naming the
// prefix; names a command makes that only start like the server's own are listed and kept.
func TestReservedNames(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	refused := []struct {
		name string
		call func() error
		want string
	}{
		{"write-tmp", func() error {
			_, err := h.C.WriteFile(ctx, ".sbx-tmp-x", 0o644, strings.NewReader("x"))
			return err
		}, ".sbx-tmp-"},
		{"write-import-below", func() error {
			_, err := h.C.WriteFile(ctx, "/workspace/a/.sbx-import-x/y", 0o644, strings.NewReader("x"))
			return err
		}, ".sbx-import-"},
		{"write-own-name", func() error {
			_, err := h.C.WriteFile(ctx, ownTmp, 0o644, strings.NewReader("x"))
			return err
		}, ".sbx-tmp-"},
		{"read", func() error {
			_, _, err := h.C.ReadFile(ctx, "d/.sbx-tmp-notes")
			return err
		}, ".sbx-tmp-"},
		{"list", func() error {
			_, _, err := h.C.ListDir(ctx, ".sbx-import-x", 0)
			return err
		}, ".sbx-import-"},
		{"remove", func() error { return h.C.Remove(ctx, ".sbx-tmp-x", true) }, ".sbx-tmp-"},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			wantCode(t, err, proto.ErrCodeInvalid)
			if !strings.Contains(err.Error(), "reserved") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want a message naming the reserved prefix %s", err, tt.want)
			}
		})
	}
	if ents, _ := os.ReadDir(h.WS); len(ents) != 0 {
		t.Fatalf("refused calls left %v in the workspace", ents)
	}

	// What commands make: look-alikes are ordinary files, the server's own forms are hidden.
	writeTree(t, h.WS, map[string]string{
		".sbx-tmp-notes":                "notes",
		".sbx-import-x/y":               "y",
		"sub/" + ownImport + "/z":       "z", // staging folders are only ever at the top
		"sub/.sbx-tmp-ABCDEF0123456789": "upper case is not the server's",
		ownTmp:                          "in flight",
		ownImport + "/staged":           "staged",
		"sub/" + ownTmp:                 "in flight",
	})
	names := func(dir string) []string {
		t.Helper()
		ents, _, err := h.C.ListDir(ctx, dir, 0)
		if err != nil {
			t.Fatalf("ListDir %s: %v", dir, err)
		}
		var out []string
		for _, e := range ents {
			out = append(out, e.Name)
		}
		return out
	}
	if got, want := names("."), []string{".sbx-import-x", ".sbx-tmp-notes", "sub"}; !slices.Equal(got, want) {
		t.Errorf("ListDir .: got %v, want %v", got, want)
	}
	if got, want := names("sub"), []string{ownImport, ".sbx-tmp-ABCDEF0123456789"}; !slices.Equal(got, want) {
		t.Errorf("ListDir sub: got %v, want %v", got, want)
	}
}

// TestSpecialFiles: sockets and FIFOs are refused quickly with a 400 naming their type, for
// reads, writes and listings; they can be removed.
func TestSpecialFiles(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	ln, err := net.Listen("unix", filepath.Join(h.WS, "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := syscall.Mkfifo(filepath.Join(h.WS, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, kind string }{{"s", "a socket"}, {"fifo", "a FIFO"}} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, _, err := h.C.ReadFile(ctx, tc.name)
			wantCode(t, err, proto.ErrCodeInvalid)
			if !strings.Contains(err.Error(), tc.kind) {
				t.Errorf("read: got %v, want it to say %s", err, tc.kind)
			}
			if el := time.Since(start); el > 2*time.Second {
				t.Errorf("read took %v", el)
			}
			_, err = h.C.WriteFile(ctx, tc.name, 0o644, strings.NewReader("x"))
			wantCode(t, err, proto.ErrCodeInvalid)
			if !strings.Contains(err.Error(), tc.kind) {
				t.Errorf("write: got %v, want it to say %s", err, tc.kind)
			}
			_, _, err = h.C.ListDir(ctx, tc.name, 0)
			var ge *proto.Error
			if !errors.As(err, &ge) || proto.HTTPStatus(ge.Code) != http.StatusBadRequest || !strings.Contains(ge.Message, tc.kind) {
				t.Errorf("list: got %v, want a 400 saying %s", err, tc.kind)
			}
		})
	}
	if ents, _, err := h.C.ListDir(ctx, ".", 0); err != nil || len(ents) != 2 {
		t.Errorf("ListDir of a folder with special files: got %v %v, want both listed", ents, err)
	}
	for _, name := range []string{"s", "fifo"} {
		if err := h.C.Remove(ctx, name, false); err != nil {
			t.Errorf("Remove %s: %v", name, err)
		}
	}
}

// TestWorkspaceFull: a full workspace disk answers ErrCodeNoSpace saying so (IsNoSpace), for
// a file write and an import, and leaves nothing half-written.
func TestWorkspaceFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	if err := syscall.Mount("tmpfs", h.WS, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(h.WS, syscall.MNT_DETACH) })
	big := strings.Repeat("x", 2<<20)
	_, err := h.C.WriteFile(ctx, "big", 0o644, strings.NewReader(big))
	wantCode(t, err, proto.ErrCodeNoSpace)
	if !proto.IsNoSpace(err) || !strings.Contains(err.Error(), proto.NoSpaceMessage) {
		t.Errorf("WriteFile on a full disk: got %v, want IsNoSpace saying so", err)
	}
	_, err = h.C.ImportWorkspace(ctx, bytes.NewReader(buildTar(t, []tarEntry{{name: "a/big", body: big}})), client.ImportOptions{Replace: true})
	if !proto.IsNoSpace(err) {
		t.Errorf("ImportWorkspace on a full disk: got %v, want IsNoSpace", err)
	}
	waitFor(t, func() bool {
		ents, _ := os.ReadDir(h.WS)
		return len(ents) == 0
	})
	if proto.IsNoSpace(errors.New(proto.NoSpaceMessage)) {
		t.Error("IsNoSpace of a plain error: got true, want false")
	}
}

// TestListDirAfter: order=name pages a folder in byte order of names, after a name, whatever
// order the kernel hands them out in; an after that is not one name is refused, never a path.
func TestListDirAfter(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 60*time.Second)
	dir := filepath.Join(h.WS, "big")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	want := []string{"sub"}
	for i := range 2500 {
		// Names in an order unlike their creation order (and unlike the kernel's).
		name := fmt.Sprintf("f%05d-%c", (i*7919)%2500, 'a'+rune(i%26))
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		want = append(want, name)
	}
	// The init's own temp names are never listed.
	if err := os.WriteFile(filepath.Join(dir, ".sbx-tmp-0123456789abcdef"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	slices.Sort(want)

	var got []string
	after, pages := "", 0
	for {
		entries, more, err := h.C.ListDirAfter(ctx, "big", after, 1000)
		if err != nil {
			t.Fatalf("page %d after %q: %v", pages, after, err)
		}
		pages++
		if len(entries) > 1000 {
			t.Fatalf("page %d: got %d entries, want at most 1000", pages, len(entries))
		}
		for _, e := range entries {
			got = append(got, e.Name)
			if e.Path != "big/"+e.Name || (e.Name == "sub") != e.IsDir {
				t.Errorf("entry %+v: want path big/%s, a folder only for sub", e, e.Name)
			}
		}
		if !more {
			break
		}
		after = entries[len(entries)-1].Name
	}
	if pages != 3 || !slices.Equal(got, want) {
		t.Errorf("got %d pages of %d names (first %v), want 3 pages of the %d names in order", pages, len(got), got[:min(3, len(got))], len(want))
	}

	// After a name that is not in the folder: the names after its place.
	entries, more, err := h.C.ListDirAfter(ctx, "big", "f02499", 10)
	if err != nil || more || len(entries) != 2 || !strings.HasPrefix(entries[0].Name, "f02499-") || entries[1].Name != "sub" {
		t.Errorf("after f02499: got %+v more=%v %v, want the two names after it", entries, more, err)
	}
	if entries, more, err := h.C.ListDirAfter(ctx, "big", "zzz", 10); err != nil || more || len(entries) != 0 {
		t.Errorf("after the last name: got %d entries more=%v %v, want none", len(entries), more, err)
	}
	// Hostile afters: a path, dots, NUL, a name longer than NAME_MAX.
	for _, bad := range []string{"../etc", "sub/x", "/etc/passwd", "..", ".", "a\x00b", strings.Repeat("x", 256)} {
		_, _, err := h.C.ListDirAfter(ctx, "big", bad, 10)
		wantCode(t, err, proto.ErrCodeInvalid)
	}
}

// TestWriteFileAllocatesLittle: a write of a small file allocates little (the server and its
// client together, both in this process). The copy into the file went through os.File's
// ReadFrom, which ignored the pooled buffer and made a 32 KiB one per write: garbage that
// makes PID 1 collect and give pages back, host round trips under gVisor.
func TestWriteFileAllocatesLittle(t *testing.T) {
	if raceEnabled {
		// Its sync.Pool drops a quarter of what is put back: a 256 KiB buffer every fourth
		// write. scripts/test.sh runs the allocation tests without it as well.
		t.Skip("allocations are not measurable under the race detector")
	}
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 60*time.Second)
	data := bytes.Repeat([]byte("x"), 2000)
	per := allocatedPer(5, 50, func() {
		t.Helper()
		if _, err := h.C.WriteFile(ctx, "small.txt", 0o644, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("a write of a 2,000-byte file allocated %d KiB", per>>10)
	if per > 24<<10 {
		t.Errorf("a write of a 2,000-byte file allocated %d KiB, want under 24 KiB", per>>10)
	}
}
