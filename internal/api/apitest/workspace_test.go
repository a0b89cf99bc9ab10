package apitest_test

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

func TestWorkspaceResolvesLikeTheGuest(t *testing.T) {
	ws := apitest.NewWorkspace()
	ctx, p := context.Background(), auth.Principal{Tenant: "acme", Project: "web"}
	ws.Put("d/a.txt", apitest.Node{Data: []byte("alpha")})
	ws.Put("in", apitest.Node{Link: "d"})
	ws.Put("abs", apitest.Node{Link: "/workspace/d/a.txt"})
	ws.Put("out", apitest.Node{Link: "/etc/shadow"})
	ws.Put("up", apitest.Node{Link: "../../etc"})
	ws.Put("fifo", apitest.Node{Special: true})
	read := func(path string) (string, error) {
		rc, _, err := ws.OpenFile(ctx, p, apitest.SandboxRunning, path)
		if err != nil {
			return "", err
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		return string(b), err
	}
	for _, tt := range []struct {
		path, want string
		code       apierror.Code
	}{
		{"d/a.txt", "alpha", ""},
		{"/workspace/d/a.txt", "alpha", ""},
		{"in/a.txt", "alpha", ""},
		{"abs", "alpha", ""},
		{"d/../d/a.txt", "alpha", ""},
		{"out", "", apierror.InvalidArgument},
		{"up/passwd", "", apierror.InvalidArgument},
		{"../etc/passwd", "", apierror.InvalidArgument},
		{"/etc/passwd", "", apierror.InvalidArgument},
		{"fifo", "", apierror.InvalidArgument},
		{"d", "", apierror.InvalidArgument},
		{"nope", "", apierror.NotFound},
	} {
		got, err := read(tt.path)
		if tt.code != "" {
			if apierror.CodeOf(err) != tt.code {
				t.Errorf("read %s: got %q, %v, want %s", tt.path, got, err, tt.code)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("read %s: got %q, %v, want %q", tt.path, got, err, tt.want)
		}
	}
	if _, _, err := ws.OpenFile(ctx, p, "sbx_other", "d/a.txt"); apierror.CodeOf(err) != apierror.NotFound {
		t.Errorf("another sandbox: got %v, want NOT_FOUND", err)
	}

	// A write replaces a link at its name, and goes through a link in its parents.
	if _, err := ws.WriteFile(ctx, p, apitest.SandboxRunning, "out", 0, strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	if n, _ := ws.Entry("out"); n.Link != "" || string(n.Data) != "x" {
		t.Errorf("after writing onto the link: got %+v, want a file", n)
	}
	if _, err := ws.WriteFile(ctx, p, apitest.SandboxRunning, "in/new/b.txt", 0o600, strings.NewReader("b")); err != nil {
		t.Fatal(err)
	}
	if n, ok := ws.Entry("d/new/b.txt"); !ok || n.Mode != 0o600 {
		t.Errorf("writing through in/: got %+v (%v), want d/new/b.txt 0600", n, ok)
	}
	for _, bad := range []string{"up/x", "../x", "d", "fifo", "d/a.txt/x"} {
		if _, err := ws.WriteFile(ctx, p, apitest.SandboxRunning, bad, 0, strings.NewReader("x")); apierror.CodeOf(err) != apierror.InvalidArgument {
			t.Errorf("write %s: got %v, want INVALID_ARGUMENT", bad, err)
		}
	}

	entries, truncated, err := ws.ListDir(ctx, p, apitest.SandboxRunning, "in", 1)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name)
	}
	if err != nil || !truncated || !slices.Equal(names, []string{"a.txt"}) {
		t.Errorf("list in/ by 1: got %v, %v, %v, want a.txt and more", names, truncated, err)
	}
	if _, _, err := ws.ListDir(ctx, p, apitest.SandboxRunning, "d/a.txt", 0); apierror.CodeOf(err) != apierror.InvalidArgument {
		t.Errorf("list a file: got %v, want INVALID_ARGUMENT", err)
	}
}

func TestWorkspaceStatAndMakeDir(t *testing.T) {
	ws := apitest.NewWorkspace()
	ctx, p := context.Background(), auth.Principal{Tenant: "acme", Project: "web"}
	ws.Put("d/a.txt", apitest.Node{Data: []byte("alpha")})
	ws.Put("out", apitest.Node{Link: "/etc"})
	ws.Put("fifo", apitest.Node{Special: true})
	for _, tt := range []struct {
		path string
		want sandbox.FileType
		code apierror.Code
	}{
		{"d", sandbox.FileDirectory, ""},
		{"d/a.txt", sandbox.FileRegular, ""},
		{"out", sandbox.FileSymlink, ""}, // the link itself, not followed
		{"fifo", sandbox.FileFIFO, ""},
		{"out/passwd", "", apierror.InvalidArgument},
		{"../etc", "", apierror.InvalidArgument},
		{"nope", "", apierror.NotFound},
	} {
		fi, err := ws.StatFile(ctx, p, apitest.SandboxRunning, tt.path)
		if got := apierror.From(err).Code; (err != nil || tt.code != "") && got != tt.code {
			t.Errorf("StatFile(%s): got %v, want %s", tt.path, err, tt.code)
		}
		if err == nil && fi.Type != tt.want {
			t.Errorf("StatFile(%s): got %s, want %s", tt.path, fi.Type, tt.want)
		}
	}
	if _, created, err := ws.MakeDir(ctx, p, apitest.SandboxRunning, "x/y"); err != nil || !created {
		t.Errorf("MakeDir(x/y): got created %v, %v", created, err)
	}
	if n, ok := ws.Entry("x"); !ok || !n.Dir {
		t.Errorf("MakeDir made no parent x: %+v", n)
	}
	if _, created, err := ws.MakeDir(ctx, p, apitest.SandboxRunning, "d"); err != nil || created {
		t.Errorf("MakeDir of an existing folder: got created %v, %v", created, err)
	}
	for _, path := range []string{"d/a.txt/sub", "d/a.txt", "out/x", "../x"} {
		if _, _, err := ws.MakeDir(ctx, p, apitest.SandboxRunning, path); apierror.From(err).Code != apierror.InvalidArgument {
			t.Errorf("MakeDir(%s): got %v, want INVALID_ARGUMENT", path, err)
		}
	}
	if _, _, err := ws.MakeDir(ctx, p, "sbx_other", "z"); apierror.From(err).Code != apierror.NotFound {
		t.Errorf("another tenant's sandbox: got %v, want NOT_FOUND", err)
	}
}
