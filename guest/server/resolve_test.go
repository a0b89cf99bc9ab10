package server

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"sandboxd/guest/proto"
)

func TestResolveIn(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"a/b", "c"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "a/b/f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{
		"la":       "a",
		"lb":       "a/b",
		"c/up":     "../a",
		"c/out":    "../..",
		"abs":      "/workspace/a/b",
		"absout":   "/etc",
		"loop1":    "loop2",
		"loop2":    "loop1",
		"lf":       "a/b/f",
		"chain":    "la/../lb",
		"dangling": "nowhere/x",
	} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	mapAbs := func(p string) (string, bool) { return underDir(p, proto.Workspace) }
	tests := []struct {
		in         string
		followLast bool
		want       string
		err        error
	}{
		{".", true, ".", nil},
		{"a/b/f", true, "a/b/f", nil},
		{"la/b/f", false, "a/b/f", nil},
		{"la", false, "la", nil},
		{"la", true, "a", nil},
		{"lb/f", true, "a/b/f", nil},
		{"c/up/b", true, "a/b", nil},
		{"c/out/x", true, "", errEscapes},
		{"c/out", false, "c/out", nil},
		{"abs/f", true, "a/b/f", nil},
		{"absout/passwd", true, "", errEscapes},
		{"absout", false, "absout", nil},
		{"loop1/x", true, "", syscall.ELOOP},
		{"lf/x", true, "", syscall.ENOTDIR},
		{"chain/f", true, "a/b/f", nil},
		{"dangling", true, "nowhere/x", nil},
		{"missing/../../x", true, "", errEscapes},
		{"a/missing/x", true, "a/missing/x", nil},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := resolveIn(root, tt.in, tt.followLast, mapAbs)
			if !errors.Is(err, tt.err) || got != tt.want {
				t.Errorf("resolveIn(%q, %v): got %q, %v; want %q, %v", tt.in, tt.followLast, got, err, tt.want, tt.err)
			}
		})
	}
	// Without mapAbs, absolute targets are refused.
	if _, err := resolveIn(root, "abs/f", true, nil); !errors.Is(err, errEscapes) {
		t.Errorf("resolveIn(abs/f) without mapAbs: got %v, want errEscapes", err)
	}
}

func TestLinkEscapes(t *testing.T) {
	s := &Server{ws: "/srv/ws"}
	tests := []struct {
		name, target string
		want         bool
	}{
		{"a", "b", false},
		{"a/b", "../c", false},
		{"a/b", "../../c", true},
		{"a", "/workspace/x", false},
		{"a", "/workspace", false},
		{"a", "/srv/ws/x", false},
		{"a", "/workspacex", true},
		{"a", "/etc", true},
		{"a", "..", true},
	}
	for _, tt := range tests {
		if got := linkEscapes(s.ws, tt.name, tt.target); got != tt.want {
			t.Errorf("linkEscapes(%q, %q): got %v, want %v", tt.name, tt.target, got, tt.want)
		}
	}
}
