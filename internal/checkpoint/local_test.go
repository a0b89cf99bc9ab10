package checkpoint_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"sandboxd/internal/checkpoint"
	"sandboxd/internal/checkpoint/storetest"
)

func newLocal(t *testing.T) *checkpoint.LocalStore {
	t.Helper()
	s, err := checkpoint.NewLocalStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestLocalStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) checkpoint.ObjectStore { return newLocal(t) })
}

func TestLocalStoreKeys(t *testing.T) {
	s := newLocal(t)
	for _, tc := range []struct {
		key string
		ok  bool
	}{
		{"k", true},
		{"a/b/c.tar.zst", true},
		{"checkpoints/acme/web/sbx_01/0000000001.json", true},
		{"a..b/c", true},
		{"", false},
		{"/abs", false},
		{"a/", false},
		{"a//b", false},
		{"..", false},
		{"a/../b", false},
		{"./a", false},
		{"a/.", false},
		{"a/.hidden", false},
		{"a/.tmp-123", false},
		{"a\x00b", false},
		{strings.Repeat("k", 1025), false},
	} {
		_, err := s.Put(t.Context(), tc.key, strings.NewReader("x"), checkpoint.PutOptions{})
		if tc.ok && err != nil {
			t.Errorf("Put(%q): got %v, want success", tc.key, err)
		}
		if !tc.ok && !errors.Is(err, checkpoint.ErrInvalidKey) {
			t.Errorf("Put(%q): got %v, want ErrInvalidKey", tc.key, err)
		}
	}
	for _, prefix := range []string{"../", "/etc/", "a/../../"} {
		if _, err := s.List(t.Context(), prefix); !errors.Is(err, checkpoint.ErrInvalidKey) {
			t.Errorf("List(%q): got %v, want ErrInvalidKey", prefix, err)
		}
	}
}

func TestLocalStoreLayout(t *testing.T) {
	s := newLocal(t)
	if _, err := s.Put(t.Context(), "a/b/obj", strings.NewReader("data"), checkpoint.PutOptions{ContentType: "text/plain"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(s.Dir(), "a", "b", "obj"))
	if err != nil || string(b) != "data" {
		t.Fatalf("file = %q, %v; want %q", b, err, "data")
	}
	// Leftovers of a crashed Put are not objects.
	if err := os.WriteFile(filepath.Join(s.Dir(), "a", "b", ".tmp-crashed"), []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err := s.List(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 || objs[0].Key != "a/b/obj" || objs[0].ContentType != "text/plain" {
		t.Errorf("List = %+v, want only a/b/obj with its content type", objs)
	}
	// A data file changed behind the store's back keeps no stale metadata.
	if err := os.WriteFile(filepath.Join(s.Dir(), "a", "b", "obj"), []byte("other"), 0o644); err != nil {
		t.Fatal(err)
	}
	if a, err := s.Stat(t.Context(), "a/b/obj"); err != nil || a.ContentType != "" {
		t.Errorf("Stat = %+v, %v; want no content type", a, err)
	}
	// Delete removes the folders it empties, not the store's own.
	os.Remove(filepath.Join(s.Dir(), "a", "b", ".tmp-crashed"))
	if err := s.Delete(t.Context(), "a/b/obj"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), "a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("folder a: got %v, want it removed", err)
	}
	if _, err := os.Stat(s.Dir()); err != nil {
		t.Errorf("store folder: %v", err)
	}
}

// Puts must not fail when a Delete in the same folder removes the folder it empties.
func TestLocalStorePutDeleteSameFolder(t *testing.T) {
	s := newLocal(t)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			key := fmt.Sprintf("a/b/c/k%d", i)
			for range 100 {
				if _, err := s.Put(t.Context(), key, strings.NewReader("x"), checkpoint.PutOptions{IfNotExists: true, ContentType: "text/plain"}); err != nil {
					t.Errorf("Put: %v", err)
					return
				}
				if err := s.Delete(t.Context(), key); err != nil {
					t.Errorf("Delete: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if entries, err := os.ReadDir(s.Dir()); err != nil || len(entries) != 0 {
		t.Errorf("store folder = %v, %v; want empty", entries, err)
	}
}
