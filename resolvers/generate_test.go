package resolvers

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedCodeIsCurrent runs gqlgen in a copy of the module and fails when that would
// change graph/ or resolvers/*.resolvers.go: the generated code matches schema.graphqls and
// gqlgen.yml, and nobody edited it by hand.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("runs gqlgen (slow on a cold build cache)")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	// Only what gqlgen reads and writes, plus the packages the resolvers import, so that the
	// check does not depend on unrelated packages of the module.
	for _, p := range []string{"go.mod", "go.sum", "gqlgen.yml", "schema.graphqls", "graph", "resolvers", "internal"} {
		if err := copyTree(filepath.Join(root, p), filepath.Join(tmp, p)); err != nil {
			t.Fatal(err)
		}
	}
	// Validation (compiling the result) is the job of `go build`/`go vet`, not of this check.
	cfg := filepath.Join(tmp, "gqlgen.yml")
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, append(b, []byte("\nskip_validation: true\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "tool", "gqlgen", "generate")
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gqlgen generate: %v\n%s", err, out)
	}
	var generated []string
	for _, dir := range []string{"graph", "resolvers"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			if dir == "graph" || strings.HasSuffix(rel, ".resolvers.go") {
				generated = append(generated, rel)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, rel := range generated {
		want, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(tmp, rel))
		if err != nil {
			t.Errorf("%s: gqlgen no longer generates it (%v)", rel, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what gqlgen generates: run `go generate ./resolvers/` and never edit generated code", rel)
		}
	}
	// Files gqlgen generates that are missing from the tree.
	for _, dir := range []string{"graph"} {
		_ = filepath.WalkDir(filepath.Join(tmp, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(tmp, path)
			if _, err := os.Stat(filepath.Join(root, rel)); err != nil {
				t.Errorf("%s: generated but missing from the tree", rel)
			}
			return nil
		})
	}
}

func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
}
