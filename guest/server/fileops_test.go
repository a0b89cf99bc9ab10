package server_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sandboxd/guest/guesttest"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
)

// outsideDir is a folder outside the workspace with one file, and a check that both are as
// they were.
func outsideDir(t *testing.T) (dir string, untouched func()) {
	t.Helper()
	dir = t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "x"), []byte("outside"), 0o644))
	must(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	return dir, func() {
		t.Helper()
		if b, err := os.ReadFile(filepath.Join(dir, "x")); err != nil || string(b) != "outside" {
			t.Errorf("outside/x: got %q %v, want it untouched", b, err)
		}
		ents, err := os.ReadDir(dir)
		if err != nil || len(ents) != 2 {
			t.Errorf("outside: got %d entries (%v), want x and sub only", len(ents), err)
		}
	}
}

func TestStat(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	outside, untouched := outsideDir(t)
	writeTree(t, h.WS, map[string]string{"d/f.txt": "hello"})
	must(t, os.Symlink("/etc", filepath.Join(h.WS, "etc")))
	must(t, os.Symlink(outside, filepath.Join(h.WS, "out")))
	must(t, os.Symlink("d", filepath.Join(h.WS, "ld")))

	for _, tc := range []struct {
		path, typ, symlink string
		size               int64
		isDir              bool
	}{
		{path: "d/f.txt", typ: proto.FileTypeFile, size: 5},
		{path: "/workspace/d", typ: proto.FileTypeDir, isDir: true},
		{path: "etc", typ: proto.FileTypeSymlink, symlink: "/etc", size: 4},
		{path: "ld", typ: proto.FileTypeSymlink, symlink: "d", size: 1},
		{path: "ld/f.txt", typ: proto.FileTypeFile, size: 5}, // a link inside the workspace leads on
		{path: ".", typ: proto.FileTypeDir, isDir: true},
	} {
		t.Run(strings.ReplaceAll(tc.path, "/", "_"), func(t *testing.T) {
			fi, err := h.C.Stat(ctx, tc.path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Type != tc.typ || fi.Symlink != tc.symlink || fi.Size != tc.size || fi.IsDir != tc.isDir {
				t.Errorf("got %+v, want type %s, symlink %q, size %d, dir %v", fi, tc.typ, tc.symlink, tc.size, tc.isDir)
			}
		})
	}
	for path, code := range map[string]string{
		"missing":      proto.ErrCodeNotFound,
		"out/x":        proto.ErrCodeInvalid, // a parent that leads out of the workspace
		"etc/passwd":   proto.ErrCodeInvalid,
		"../x":         proto.ErrCodeInvalid,
		".sbx-tmp-abc": proto.ErrCodeInvalid,
		"d/f.txt/x":    proto.ErrCodeNotDir,
	} {
		t.Run("error-"+strings.ReplaceAll(path, "/", "_"), func(t *testing.T) {
			_, err := h.C.Stat(ctx, path)
			wantCode(t, err, code)
		})
	}
	untouched()
}

func TestMkdir(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	outside, untouched := outsideDir(t)
	writeTree(t, h.WS, map[string]string{"file": "x"})
	must(t, os.Symlink(outside, filepath.Join(h.WS, "out")))

	res, err := h.C.Mkdir(ctx, "a/b/c")
	if err != nil || !res.Created || !res.IsDir || res.Path != "/workspace/a/b/c" || res.Type != proto.FileTypeDir {
		t.Fatalf("Mkdir(a/b/c): got %+v %v, want created", res, err)
	}
	if fi, err := os.Stat(filepath.Join(h.WS, "a/b/c")); err != nil || !fi.IsDir() {
		t.Fatalf("a/b/c: %v", err)
	}
	res, err = h.C.Mkdir(ctx, "a/b")
	if err != nil || res.Created {
		t.Errorf("Mkdir of an existing directory: got %+v %v, want no error, created false", res, err)
	}
	for path, code := range map[string]string{
		"file":         proto.ErrCodeExists,
		"file/sub":     proto.ErrCodeNotDir,
		"out/new":      proto.ErrCodeInvalid,
		"/etc/new":     proto.ErrCodeInvalid,
		".":            proto.ErrCodeInvalid,
		".sbx-trash-x": proto.ErrCodeInvalid,
	} {
		t.Run(strings.ReplaceAll(path, "/", "_"), func(t *testing.T) {
			_, err := h.C.Mkdir(ctx, path)
			wantCode(t, err, code)
		})
	}
	untouched()
}

func TestMove(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	outside, untouched := outsideDir(t)
	writeTree(t, h.WS, map[string]string{"a.txt": "A", "b.txt": "B", "d/in.txt": "in", "full/x": "x"})
	must(t, os.Mkdir(filepath.Join(h.WS, "empty"), 0o755))
	must(t, os.Symlink(outside, filepath.Join(h.WS, "out")))
	must(t, os.Symlink("/etc", filepath.Join(h.WS, "etclink")))

	fi, err := h.C.Move(ctx, proto.MoveRequest{From: "a.txt", To: "d/moved.txt"})
	if err != nil || fi.Path != "/workspace/d/moved.txt" || fi.Size != 1 {
		t.Fatalf("Move: got %+v %v", fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(h.WS, "d/moved.txt")); string(b) != "A" {
		t.Errorf("d/moved.txt: got %q, want A", b)
	}
	// An existing target is refused unless overwrite.
	_, err = h.C.Move(ctx, proto.MoveRequest{From: "b.txt", To: "d/moved.txt"})
	wantCode(t, err, proto.ErrCodeExists)
	if _, err := h.C.Move(ctx, proto.MoveRequest{From: "b.txt", To: "d/moved.txt", Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(h.WS, "d/moved.txt")); string(b) != "B" {
		t.Errorf("after overwrite: got %q, want B", b)
	}
	// A symlink moves as itself, never what it points to; a target that is a link to
	// outside is replaced, never written through.
	if _, err := h.C.Move(ctx, proto.MoveRequest{From: "out", To: "d/out2"}); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(filepath.Join(h.WS, "d/out2")); err != nil || target != outside {
		t.Errorf("moved link: got %q %v, want the link itself", target, err)
	}
	_, err = h.C.Move(ctx, proto.MoveRequest{From: "d/in.txt", To: "etclink"})
	wantCode(t, err, proto.ErrCodeExists)
	if _, err := h.C.Move(ctx, proto.MoveRequest{From: "d/in.txt", To: "etclink", Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(h.WS, "etclink")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("etclink: got %v %v, want the moved file in its place", fi, err)
	}
	must(t, os.Symlink(outside, filepath.Join(h.WS, "out")))
	for _, tc := range []struct {
		name string
		req  proto.MoveRequest
		code string
	}{
		{"into-itself", proto.MoveRequest{From: "d", To: "d/sub"}, proto.ErrCodeInvalid},
		{"same", proto.MoveRequest{From: "d", To: "./d"}, proto.ErrCodeInvalid},
		{"missing", proto.MoveRequest{From: "nope", To: "x"}, proto.ErrCodeNotFound},
		{"target-parent-missing", proto.MoveRequest{From: "d", To: "no/such"}, proto.ErrCodeNotFound},
		{"source-through-outside-link", proto.MoveRequest{From: "out/x", To: "stolen"}, proto.ErrCodeInvalid},
		{"target-through-outside-link", proto.MoveRequest{From: "d", To: "out/planted"}, proto.ErrCodeInvalid},
		{"target-in-etc", proto.MoveRequest{From: "d", To: "/etc/planted"}, proto.ErrCodeInvalid},
		{"workspace-source", proto.MoveRequest{From: "/workspace", To: "x"}, proto.ErrCodeInvalid},
		{"workspace-target", proto.MoveRequest{From: "d", To: "."}, proto.ErrCodeInvalid},
		{"reserved-target", proto.MoveRequest{From: "d", To: ".sbx-import-0123456789abcdef"}, proto.ErrCodeInvalid},
		{"onto-full-dir", proto.MoveRequest{From: "empty", To: "full", Overwrite: true}, proto.ErrCodeNotEmpty},
		{"file-onto-dir", proto.MoveRequest{From: "d/moved.txt", To: "full", Overwrite: true}, proto.ErrCodeIsDir},
		{"dir-onto-file", proto.MoveRequest{From: "empty", To: "d/moved.txt", Overwrite: true}, proto.ErrCodeNotDir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.C.Move(ctx, tc.req)
			wantCode(t, err, tc.code)
		})
	}
	untouched()
	if _, err := os.Stat("/etc/planted"); err == nil {
		t.Error("/etc/planted exists")
	}
}

func TestDelete(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	outside, untouched := outsideDir(t)
	writeTree(t, h.WS, map[string]string{"tree/a/b/c.txt": "c", "tree/top.txt": "t"})
	// The tree holds links to outside: a recursive delete removes the links, never their targets.
	must(t, os.Symlink(outside, filepath.Join(h.WS, "tree/a/out")))
	must(t, os.Symlink(filepath.Join(outside, "x"), filepath.Join(h.WS, "tree/a/b/outfile")))
	must(t, os.Symlink(outside, filepath.Join(h.WS, "out")))

	err := h.C.Remove(ctx, "tree", false)
	wantCode(t, err, proto.ErrCodeNotEmpty)
	wantCode(t, h.C.Remove(ctx, "out/x", true), proto.ErrCodeInvalid)
	wantCode(t, h.C.Remove(ctx, "out/sub", true), proto.ErrCodeInvalid)
	if err := h.C.Remove(ctx, "tree", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(h.WS, "tree")); !os.IsNotExist(err) {
		t.Errorf("tree after a recursive delete: got %v, want gone at once", err)
	}
	// The name is free at once; the trash is hidden and goes away.
	if _, err := h.C.Mkdir(ctx, "tree"); err != nil {
		t.Errorf("Mkdir(tree) after the delete: %v", err)
	}
	entries, _, err := h.C.ListDir(ctx, ".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name, ".sbx-") {
			t.Errorf("listing shows %s", e.Name)
		}
	}
	waitFor(t, func() bool {
		m, _ := filepath.Glob(filepath.Join(h.WS, ".sbx-trash-*"))
		return len(m) == 0
	})
	// The link to outside is removed as a link.
	if err := h.C.Remove(ctx, "out", true); err != nil {
		t.Fatal(err)
	}
	untouched()
}

// TestDeleteLargeTree: a recursive delete of a large tree answers at once; the tree is
// removed in the background while the server answers other calls.
func TestDeleteLargeTree(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 2*time.Minute)
	const dirs, files = 40, 250
	for d := range dirs {
		dir := filepath.Join(h.WS, "big", fmt.Sprintf("d%02d", d))
		must(t, os.MkdirAll(dir, 0o755))
		for f := range files {
			must(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d", f)), nil, 0o644))
		}
	}
	start := time.Now()
	if err := h.C.Remove(ctx, "big", true); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if took > 2*time.Second {
		t.Errorf("deleting %d entries took %v, want an answer at once", dirs*files, took)
	}
	if _, err := h.C.Stat(ctx, "big"); err == nil {
		t.Error("big is still there")
	}
	waitFor(t, func() bool {
		m, _ := filepath.Glob(filepath.Join(h.WS, ".sbx-trash-*"))
		return len(m) == 0
	})
}

// TestStaleTrashRemovedAtStart: trash left by a server that stopped midway is removed by the
// next one.
func TestStaleTrashRemovedAtStart(t *testing.T) {
	ws := t.TempDir()
	writeTree(t, ws, map[string]string{".sbx-trash-0123456789abcdef/a/b": "x", ".sbx-trash-notes/keep": "k"})
	srv, err := server.New(server.Options{Workspace: ws, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	waitFor(t, func() bool {
		_, err := os.Stat(filepath.Join(ws, ".sbx-trash-0123456789abcdef"))
		return os.IsNotExist(err)
	})
	if _, err := os.Stat(filepath.Join(ws, ".sbx-trash-notes/keep")); err != nil {
		t.Errorf("a command's own .sbx-trash-notes was removed: %v", err)
	}
}

// TestOpsUnderSymlinkSwaps: while a loop swaps a parent directory for a symlink to outside
// and back, moves, deletes, mkdirs and stats through it either act inside the workspace or
// fail; nothing outside is ever touched.
func TestOpsUnderSymlinkSwaps(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, time.Minute)
	outside, untouched := outsideDir(t)
	must(t, os.MkdirAll(filepath.Join(h.WS, "p"), 0o755))
	stop := make(chan struct{})
	var swaps atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		p, real, link := filepath.Join(h.WS, "p"), filepath.Join(h.WS, "p.real"), filepath.Join(h.WS, "p.link")
		_ = os.Symlink(outside, link)
		for {
			select {
			case <-stop:
				return
			default:
			}
			// p is a real directory, then (renamed over) a link to outside, then real again.
			_ = os.WriteFile(filepath.Join(p, "x"), []byte("inside"), 0o644)
			_ = os.Mkdir(filepath.Join(p, "sub"), 0o755)
			_ = os.Rename(p, real)
			_ = os.Symlink(outside, link)
			_ = os.Rename(link, p)
			_ = os.Rename(real, link) // fails (link is gone): keep the real dir aside
			_ = os.Remove(p)
			_ = os.Rename(real, p)
			swaps.Add(1)
		}
	})
	deadline := time.Now().Add(3 * time.Second)
	ops := 0
	for time.Now().Before(deadline) {
		_ = h.C.Remove(ctx, "p/x", false)
		_ = h.C.Remove(ctx, "p/sub", true)
		_, _ = h.C.Move(ctx, proto.MoveRequest{From: "p/x", To: "stolen", Overwrite: true})
		_, _ = h.C.Move(ctx, proto.MoveRequest{From: "p/sub", To: "stolen-dir", Overwrite: true})
		_, _ = h.C.Mkdir(ctx, "p/sub/planted")
		_, _ = h.C.Stat(ctx, "p/x")
		ops += 6
	}
	close(stop)
	wg.Wait()
	t.Logf("%d operations during %d swaps", ops, swaps.Load())
	untouched()
	if _, err := os.Stat(filepath.Join(outside, "sub/planted")); err == nil {
		t.Error("a directory was made outside")
	}
	if b, err := os.ReadFile(filepath.Join(h.WS, "stolen")); err == nil && string(b) != "inside" {
		t.Errorf("stolen: got %q, want only what was inside", b)
	}
}
