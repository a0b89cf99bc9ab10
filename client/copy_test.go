package client_test

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"sandboxd/client"
	"sandboxd/internal/api/apitest"
	"sandboxd/internal/rest"
	"sandboxd/internal/sandbox"
	"sandboxd/resolvers"
)

// workspaceEnv is the real REST and GraphQL handlers over an in-memory workspace.
func workspaceEnv(t *testing.T) (*apitest.Workspace, *client.Client) {
	t.Helper()
	ws := apitest.NewWorkspace()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	authn := apitest.Authenticator(t)
	mux := http.NewServeMux()
	mux.Handle("/graphql", resolvers.NewHandler(ws, authn, resolvers.HandlerOptions{Logger: log}))
	mux.Handle("/", rest.New(ws, authn, log, nil))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, err := client.New(client.WithBaseURL(srv.URL), client.WithAPIKey(apitest.UserKey), client.WithHTTPClient(srv.Client()))
	if err != nil {
		t.Fatal(err)
	}
	return ws, c
}

func writeLocal(t *testing.T, p, data string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// localTree is a folder with files, a link out of it, a link inside, a FIFO and an empty folder.
func localTree(t *testing.T) string {
	dir := filepath.Join(t.TempDir(), "src")
	writeLocal(t, filepath.Join(dir, "a.txt"), "alpha", 0o644)
	writeLocal(t, filepath.Join(dir, "bin", "run.sh"), "#!/bin/sh\n", 0o755)
	writeLocal(t, filepath.Join(dir, "deep", "er", "c.txt"), "gamma", 0o600)
	must(t, os.Symlink("/etc/passwd", filepath.Join(dir, "passwd")))
	must(t, os.Symlink("a.txt", filepath.Join(dir, "alias")))
	must(t, syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644))
	must(t, os.Mkdir(filepath.Join(dir, "empty"), 0o755))
	return dir
}

func skippedNames(res client.CopyResult, remote bool) []string {
	var out []string
	for _, s := range res.Skipped {
		if remote {
			out = append(out, s.Remote)
		} else {
			out = append(out, filepath.Base(s.Local))
		}
	}
	slices.Sort(out)
	return out
}

func TestCopyInTree(t *testing.T) {
	ws, c := workspaceEnv(t)
	ctx := ctxT(t)
	src := localTree(t)
	var told []string
	res, err := c.CopyIn(ctx, apitest.SandboxRunning, src, "dst", client.CopyOptions{OnFile: func(f client.CopiedFile) { told = append(told, f.Remote) }})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ws.Paths(), []string{"dst", "dst/a.txt", "dst/bin", "dst/bin/run.sh", "dst/deep", "dst/deep/er", "dst/deep/er/c.txt", "dst/empty"}; !slices.Equal(got, want) {
		t.Errorf("got workspace %v, want %v", got, want)
	}
	for p, want := range map[string]os.FileMode{"dst/a.txt": 0o644, "dst/bin/run.sh": 0o755, "dst/deep/er/c.txt": 0o600} {
		if n, _ := ws.Entry(p); n.Mode != want {
			t.Errorf("%s: got mode %o, want %o", p, n.Mode, want)
		}
	}
	if n, _ := ws.Entry("dst/deep/er/c.txt"); string(n.Data) != "gamma" {
		t.Errorf("got dst/deep/er/c.txt %q, want gamma", n.Data)
	}
	if res.Dest != "dst" || res.Files != 3 || res.Bytes != int64(len("alpha#!/bin/sh\ngamma")) || res.Dirs != 5 {
		t.Errorf("got result %+v, want 3 files of 20 bytes and 5 folders into dst", res)
	}
	// Folders are made as the parents of files; the empty one alone, with MakeDir.
	if calls := ws.CallsTo("MakeDir"); len(calls) != 1 || calls[0].Path != "dst/empty" {
		t.Errorf("got MakeDir calls %+v, want dst/empty alone", calls)
	}
	if got, want := skippedNames(res, true), []string{"dst/alias", "dst/fifo", "dst/passwd"}; !slices.Equal(got, want) {
		t.Errorf("got skipped %v, want %v", got, want)
	}
	if len(told) != 3+5+3 {
		t.Errorf("OnFile was told of %d entries (%v), want 11", len(told), told)
	}

	// Into an existing folder: under the source's name.
	if _, err := c.CopyIn(ctx, apitest.SandboxRunning, src, "dst", client.CopyOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, ok := ws.Entry("dst/src/deep/er/c.txt"); !ok {
		t.Errorf("copying into the existing folder dst: got %v, want dst/src/…", ws.Paths())
	}
	// One file to a new name, then into a folder named with a trailing slash.
	if _, err := c.CopyIn(ctx, apitest.SandboxRunning, filepath.Join(src, "a.txt"), "/workspace/one.txt", client.CopyOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CopyIn(ctx, apitest.SandboxRunning, filepath.Join(src, "a.txt"), "new/", client.CopyOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"one.txt", "new/a.txt"} {
		if n, ok := ws.Entry(p); !ok || string(n.Data) != "alpha" {
			t.Errorf("%s: got %q (%v), want alpha", p, n.Data, ok)
		}
	}
}

func TestCopyInRefuses(t *testing.T) {
	ws, c := workspaceEnv(t)
	ctx := ctxT(t)
	src := localTree(t)
	ws.Put("file", apitest.Node{Data: []byte("x")})
	ws.Put("out", apitest.Node{Link: "/etc"})
	tests := []struct {
		name, local, remote string
		opts                client.CopyOptions
		code                string // a server error; "" for a *CopyError
	}{
		{"local-link", filepath.Join(src, "passwd"), "x", client.CopyOptions{}, ""},
		{"local-fifo", filepath.Join(src, "fifo"), "x", client.CopyOptions{}, ""},
		{"folder-over-file", src, "file", client.CopyOptions{}, ""},
		{"too-many-files", src, "x", client.CopyOptions{MaxFiles: 3}, ""},
		{"too-many-bytes", src, "x", client.CopyOptions{MaxBytes: 6}, ""},
		{"remote-dotdot", filepath.Join(src, "a.txt"), "../escape", client.CopyOptions{}, client.CodeInvalidArgument},
		{"remote-absolute", filepath.Join(src, "a.txt"), "/etc/x", client.CopyOptions{}, client.CodeInvalidArgument},
		{"remote-link-out", filepath.Join(src, "a.txt"), "out/x", client.CopyOptions{}, client.CodeInvalidArgument},
		{"another-tenants-sandbox", filepath.Join(src, "a.txt"), "x", client.CopyOptions{}, client.CodeNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := ws.Paths()
			id := apitest.SandboxRunning
			if tt.name == "another-tenants-sandbox" {
				id = "sbx_other"
			}
			_, err := c.CopyIn(ctx, id, tt.local, tt.remote, tt.opts)
			var ce *client.CopyError
			switch {
			case tt.code == "" && !errors.As(err, &ce):
				t.Errorf("got %v, want a *client.CopyError", err)
			case tt.code != "" && !client.IsCode(err, tt.code):
				t.Errorf("got %v, want %s", err, tt.code)
			}
			if tt.name != "too-many-files" && tt.name != "too-many-bytes" && !slices.Equal(ws.Paths(), before) {
				t.Errorf("the workspace changed to %v, want %v", ws.Paths(), before)
			}
		})
	}
}

// remoteTree fills the workspace with files, a folder, links out and in, and a FIFO.
func remoteTree(ws *apitest.Workspace) {
	ws.Put("proj/a.txt", apitest.Node{Data: []byte("alpha")})
	ws.Put("proj/bin/run.sh", apitest.Node{Data: []byte("#!/bin/sh\n"), Mode: 0o755})
	ws.Put("proj/secret", apitest.Node{Data: []byte("s"), Mode: 0o600})
	ws.Put("proj/shadow", apitest.Node{Link: "/etc/shadow"})
	ws.Put("proj/up", apitest.Node{Link: "../../../etc/passwd"})
	ws.Put("proj/self", apitest.Node{Link: "."})
	ws.Put("proj/pipe", apitest.Node{Special: true})
	ws.Put("shadow", apitest.Node{Link: "/etc/shadow"})
}

func TestCopyOutTree(t *testing.T) {
	ws, c := workspaceEnv(t)
	ctx := ctxT(t)
	remoteTree(ws)
	dst := t.TempDir()
	res, err := c.CopyOut(ctx, apitest.SandboxRunning, "proj", filepath.Join(dst, "got"), client.CopyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	must(t, filepath.WalkDir(dst, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, _ := d.Info()
		if rel, _ := filepath.Rel(dst, p); rel != "." {
			got = append(got, rel+" "+fi.Mode().String())
		}
		return nil
	}))
	want := []string{"got drwxr-xr-x", "got/a.txt -rw-r--r--", "got/bin drwxr-xr-x", "got/bin/run.sh -rwxr-xr-x", "got/secret -rw-------"}
	if !slices.Equal(got, want) {
		t.Errorf("got local tree %v, want %v", got, want)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "got", "bin", "run.sh")); string(b) != "#!/bin/sh\n" {
		t.Errorf("got run.sh %q, want the script", b)
	}
	if gotSkip, wantSkip := skippedNames(res, true), []string{"proj/pipe", "proj/self", "proj/shadow", "proj/up"}; !slices.Equal(gotSkip, wantSkip) {
		t.Errorf("got skipped %v, want %v", gotSkip, wantSkip)
	}
	if res.Files != 3 || res.Dirs != 2 || res.Bytes != 5+10+1 {
		t.Errorf("got %+v, want 3 files, 2 folders, 16 bytes", res)
	}

	// Into an existing folder: under the source's name; one file into it too.
	if _, err := c.CopyOut(ctx, apitest.SandboxRunning, "/workspace/proj/", filepath.Join(dst, "got"), client.CopyOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CopyOut(ctx, apitest.SandboxRunning, "proj/a.txt", filepath.Join(dst, "got"), client.CopyOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"got/proj/bin/run.sh", "got/a.txt"} {
		if _, err := os.Stat(filepath.Join(dst, p)); err != nil {
			t.Errorf("want %s: %v", p, err)
		}
	}
}

func TestCopyOutRefuses(t *testing.T) {
	ws, c := workspaceEnv(t)
	ctx := ctxT(t)
	remoteTree(ws)
	tests := []struct {
		name, remote string
		opts         client.CopyOptions
		code         string // a server error; "" for a *CopyError
	}{
		{"link-to-host-shadow", "shadow", client.CopyOptions{}, client.CodeInvalidArgument},
		{"link-to-host-shadow-in-folder", "proj/shadow", client.CopyOptions{}, client.CodeInvalidArgument},
		{"dotdot", "../etc/passwd", client.CopyOptions{}, client.CodeInvalidArgument},
		{"absolute-outside", "/etc/shadow", client.CopyOptions{}, client.CodeInvalidArgument},
		{"missing", "nope", client.CopyOptions{}, client.CodeNotFound},
		{"special", "proj/pipe", client.CopyOptions{}, ""}, // Stat says FIFO: refused before a read
		{"another-tenants-sandbox", "proj", client.CopyOptions{}, client.CodeNotFound},
		{"too-many-files", "proj", client.CopyOptions{MaxFiles: 2}, ""},
		{"too-many-bytes", "proj", client.CopyOptions{MaxBytes: 7}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := t.TempDir()
			id := apitest.SandboxRunning
			if tt.name == "another-tenants-sandbox" {
				id = "sbx_other"
			}
			_, err := c.CopyOut(ctx, id, tt.remote, filepath.Join(dst, "out"), tt.opts)
			var ce *client.CopyError
			switch {
			case tt.code == "" && !errors.As(err, &ce):
				t.Errorf("got %v, want a *client.CopyError", err)
			case tt.code != "" && !client.IsCode(err, tt.code):
				t.Errorf("got %v, want %s", err, tt.code)
			}
			entries, _ := os.ReadDir(dst)
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), ".sandboxctl-") || tt.code != "" {
					t.Errorf("left %s behind, want nothing (a failed file leaves no part)", e.Name())
				}
			}
		})
	}
}

// A link already in the destination is replaced, never written through.
func TestCopyOutNeverWritesThroughALocalLink(t *testing.T) {
	ws, c := workspaceEnv(t)
	ctx := ctxT(t)
	ws.Put("proj/a.txt", apitest.Node{Data: []byte("from the sandbox")})
	base := t.TempDir()
	victim := filepath.Join(base, "victim")
	writeLocal(t, victim, "untouched", 0o644)
	dst := filepath.Join(base, "dst")
	must(t, os.MkdirAll(filepath.Join(dst, "proj"), 0o755))
	must(t, os.Symlink(victim, filepath.Join(dst, "proj", "a.txt")))
	must(t, os.Symlink(victim, filepath.Join(dst, "single")))
	if _, err := c.CopyOut(ctx, apitest.SandboxRunning, "proj", dst, client.CopyOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CopyOut(ctx, apitest.SandboxRunning, "proj/a.txt", filepath.Join(dst, "single"), client.CopyOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "untouched" {
		t.Errorf("the link's target now holds %q, want untouched", b)
	}
	for _, p := range []string{filepath.Join(dst, "proj", "a.txt"), filepath.Join(dst, "single")} {
		fi, err := os.Lstat(p)
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s: got %v, %v, want a regular file in place of the link", p, fi, err)
		}
	}
	// A link where a folder goes is refused, not followed.
	must(t, os.Remove(filepath.Join(dst, "proj", "a.txt")))
	ws.Put("proj/sub/b.txt", apitest.Node{Data: []byte("b")})
	must(t, os.Symlink(base, filepath.Join(dst, "proj", "sub")))
	var ce *client.CopyError
	if _, err := c.CopyOut(ctx, apitest.SandboxRunning, "proj", dst, client.CopyOptions{}); !errors.As(err, &ce) {
		t.Errorf("got %v, want a *client.CopyError for the link in place of proj/sub", err)
	}
	if _, err := os.Stat(filepath.Join(base, "b.txt")); err == nil {
		t.Error("b.txt was written through the link, want it refused")
	}
}

// A server that answers names that are not one name in their folder gets nothing written.
func TestCopyOutHostileNames(t *testing.T) {
	for _, name := range []string{"../evil", "a/b", "..", ".", ""} {
		t.Run(strings.NewReplacer("/", "_", ".", "dot").Replace(name)+"x", func(t *testing.T) {
			ws, c := workspaceEnv(t)
			ctx := ctxT(t)
			ws.Put("proj/evil", apitest.Node{Data: []byte("payload")})
			ws.ListHook = func(dir string, entries []sandbox.FileInfo) []sandbox.FileInfo {
				for i := range entries {
					entries[i].Name = name
				}
				return entries
			}
			base := t.TempDir()
			dst := filepath.Join(base, "in", "dst")
			must(t, os.MkdirAll(dst, 0o755))
			var ce *client.CopyError
			if _, err := c.CopyOut(ctx, apitest.SandboxRunning, "proj", dst, client.CopyOptions{}); !errors.As(err, &ce) {
				t.Errorf("got %v, want a *client.CopyError", err)
			}
			var files []string
			must(t, filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					files = append(files, p)
				}
				return err
			}))
			if len(files) != 0 {
				t.Errorf("wrote %v, want nothing", files)
			}
		})
	}
}

func TestCopyOutLargeFolder(t *testing.T) {
	ws, c := workspaceEnv(t)
	ctx := ctxT(t)
	for i := range 1200 {
		ws.Put(fmt.Sprintf("big/f%04d", i), apitest.Node{Data: []byte("x")})
	}
	res, err := c.CopyOut(ctx, apitest.SandboxRunning, "big", filepath.Join(t.TempDir(), "big"), client.CopyOptions{})
	if err != nil || res.Files != 1200 {
		t.Fatalf("got %+v, %v, want 1200 files (listed past the server's default page)", res, err)
	}
}

func TestExecByID(t *testing.T) {
	e := newEnv(t)
	c := e.client(t)
	ctx := ctxT(t)
	got, err := c.ExecByID(ctx, apitest.ExecEnded, true)
	if err != nil {
		t.Fatal(err)
	}
	if got.SandboxID != apitest.SandboxRunning || got.ExitCode != 3 || got.State != client.ExecEnded || got.Stdout != "hello\n" ||
		got.Stderr != "oops\xff" || !got.StderrTruncated || got.Duration.Milliseconds() != 1500 {
		t.Errorf("got %+v, want %s of %s, exit 3, stdout hello, stderr oops\\xff (truncated)", got, apitest.ExecEnded, apitest.SandboxRunning)
	}
	if got, err := c.ExecByID(ctx, apitest.ExecRunning, false); err != nil || got.State != client.ExecRunning || got.Stdout != "" {
		t.Errorf("got %+v, %v, want RUNNING without output", got, err)
	}
	if _, err := c.ExecByID(ctx, "exec_other", false); !client.IsCode(err, client.CodeNotFound) {
		t.Errorf("got %v, want NOT_FOUND", err)
	}
}
