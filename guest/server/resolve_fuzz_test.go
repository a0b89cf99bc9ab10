package server

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"sandboxd/guest/proto"
	"sandboxd/internal/tarsafe/tarsafetest"
)

// FuzzResolvePath resolves client paths the way the files API does (relPath, then resolve)
// in a workspace beside a sibling folder "outside", holding symlinks that point out of it
// (absolute, relative "../..", through a subfolder, chained, looping) and some that stay in
// (relative, absolute under /workspace or the workspace's real path). It never panics, and a
// path it resolves is "." or clean, relative and without "..", has no symlink in its folders
// (nor as its last component when links are followed), and, evaluated by the kernel
// (filepath.EvalSymlinks of its longest existing prefix), stays inside the workspace.
func FuzzResolvePath(f *testing.F) {
	for _, s := range []string{".", "a/b/f", "la/b/f", "la", "lb/f", "c/up/b", "c/out/x", "c/out", "abs/f",
		"absout/passwd", "absout", "loop1/x", "lf/x", "chain/f", "dangling", "missing/../../x", "a/missing/x",
		"/workspace/la/b", "/workspace/../etc/passwd", "out2/secret", "absreal/b/f", "a/l2/x", "a/l2", "self/self/la",
		"a/parent/c/out", "deep/x", "etc/passwd", "../outside/secret", "a/b/../../c/out/outside/secret",
		".sbx-tmp-0123456789abcdef", "a//b/./f", "wsup/ws/a"} {
		f.Add(s, true)
		f.Add(s, false)
	}
	parent := tarsafetest.TempDir(f)
	ws, outside := filepath.Join(parent, "ws"), filepath.Join(parent, "outside")
	for _, d := range []string{"a/b", "c", "d/e"} {
		if err := os.MkdirAll(filepath.Join(ws, d), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.MkdirAll(outside, 0o755); err != nil {
		f.Fatal(err)
	}
	for p, body := range map[string]string{filepath.Join(ws, "a/b/f"): "f", filepath.Join(outside, "secret"): "s"} {
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			f.Fatal(err)
		}
	}
	for name, target := range map[string]string{
		"la":       "a",
		"lb":       "a/b",
		"c/up":     "../a",
		"c/out":    "../..",
		"out2":     "../outside",
		"abs":      proto.Workspace + "/a/b",
		"absreal":  filepath.Join(ws, "a"),
		"absout":   outside,
		"etc":      "/etc",
		"loop1":    "loop2",
		"loop2":    "loop1",
		"lf":       "a/b/f",
		"chain":    "la/../lb",
		"dangling": "nowhere/x",
		"self":     ".",
		"a/parent": "..",
		"a/l1":     "..",
		"a/l2":     "l1/../outside",
		"deep":     "d/e/../../c/out",
		"wsup":     "..",
	} {
		if err := os.Symlink(target, filepath.Join(ws, name)); err != nil {
			f.Fatal(err)
		}
	}
	realWS, err := filepath.EvalSymlinks(ws)
	if err != nil {
		f.Fatal(err)
	}
	root, err := os.OpenRoot(ws)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { root.Close() })
	s := &Server{ws: ws}

	f.Fuzz(func(t *testing.T, p string, followLast bool) {
		if len(p) > 4096 {
			return
		}
		rel, perr := s.relPath(p, true)
		if perr != nil {
			if perr.Code != proto.ErrCodeInvalid {
				t.Fatalf("relPath(%q): got code %s, want %s", p, perr.Code, proto.ErrCodeInvalid)
			}
			return
		}
		tarsafetest.CheckCleanName(t, p, rel)
		got, perr := s.resolve(root, rel, followLast)
		if perr != nil {
			switch perr.Code {
			case proto.ErrCodeInvalid, proto.ErrCodeNotFound, proto.ErrCodeNotDir:
			default:
				t.Fatalf("resolve(%q, %v): got code %s (%s), want invalid, not_found or not_dir", rel, followLast, perr.Code, perr.Message)
			}
			return
		}
		tarsafetest.CheckCleanName(t, rel, got)
		// No symlink in its folders, nor as the last component when links are followed; the
		// kernel's evaluation of what exists of it stays inside.
		parts := strings.Split(got, "/")
		cur := ws
		for i, part := range parts {
			if part == "." {
				break
			}
			cur = filepath.Join(cur, part)
			fi, err := os.Lstat(cur)
			if errors.Is(err, fs.ErrNotExist) {
				break
			}
			if err != nil {
				t.Fatalf("resolve(%q, %v) = %q: lstat %s: %v", rel, followLast, got, cur, err)
			}
			last := i == len(parts)-1
			if fi.Mode()&fs.ModeSymlink != 0 && (!last || followLast) {
				t.Fatalf("resolve(%q, %v) = %q, which goes through the symlink %s", rel, followLast, got, cur)
			}
			if fi.Mode()&fs.ModeSymlink != 0 {
				break // the last component, not followed
			}
			real, err := filepath.EvalSymlinks(cur)
			if err != nil {
				t.Fatalf("resolve(%q, %v) = %q: EvalSymlinks(%s): %v", rel, followLast, got, cur, err)
			}
			if r, err := filepath.Rel(realWS, real); err != nil || !filepath.IsLocal(r) && r != "." {
				t.Fatalf("resolve(%q, %v) = %q, which the kernel evaluates to %s, outside %s", rel, followLast, got, real, realWS)
			}
		}
		if path.IsAbs(got) {
			t.Fatalf("resolve(%q) = %q, an absolute path", rel, got)
		}
	})
}
