// Package storetest is the conformance suite of checkpoint.ObjectStore implementations.
package storetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"maps"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/internal/checkpoint"
)

// Run runs the suite. newStore returns an empty store for one subtest (and registers its
// cleanup with t).
func Run(t *testing.T, newStore func(t *testing.T) checkpoint.ObjectStore) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s checkpoint.ObjectStore)
	}{
		{"PutGetStat", testPutGetStat},
		{"EmptyObject", testEmptyObject},
		{"List", testList},
		{"IfNotExists", testIfNotExists},
		{"IfNotExistsRace", testIfNotExistsRace},
		{"Overwrite", testOverwrite},
		{"FailingReader", testFailingReader},
		{"FailingOverwriteKeepsOld", testFailingOverwriteKeepsOld},
		{"CancelledBefore", testCancelledBefore},
		{"CancelledMidway", testCancelledMidway},
		{"Delete", testDelete},
		{"Missing", testMissing},
		{"Large", testLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newStore(t)) })
	}
}

func put(t *testing.T, s checkpoint.ObjectStore, key, body string, opts checkpoint.PutOptions) checkpoint.ObjectAttrs {
	t.Helper()
	a, err := s.Put(t.Context(), key, strings.NewReader(body), opts)
	if err != nil {
		t.Fatalf("Put(%q): %v", key, err)
	}
	return a
}

func get(t *testing.T, s checkpoint.ObjectStore, key string) (string, checkpoint.ObjectAttrs) {
	t.Helper()
	rc, a, err := s.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc) // small test objects only
	if err != nil {
		t.Fatalf("Get(%q): read: %v", key, err)
	}
	return string(b), a
}

func wantNotExist(t *testing.T, s checkpoint.ObjectStore, key string) {
	t.Helper()
	if a, err := s.Stat(t.Context(), key); !errors.Is(err, checkpoint.ErrNotExist) {
		t.Fatalf("Stat(%q) = %+v, %v; want ErrNotExist", key, a, err)
	}
	objs, err := s.List(t.Context(), "")
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, o := range objs {
		if o.Key == key {
			t.Fatalf("List lists %q, want it gone", key)
		}
	}
}

func keys(objs []checkpoint.ObjectAttrs) []string {
	out := []string{}
	for _, o := range objs {
		out = append(out, o.Key)
	}
	return out
}

func testPutGetStat(t *testing.T, s checkpoint.ObjectStore) {
	const key, body = "a/b/c.json", `{"x":1}`
	meta := map[string]string{"snapshot-id": "snap_1", "k": "v"}
	start := time.Now()
	a := put(t, s, key, body, checkpoint.PutOptions{ContentType: "application/json", Metadata: meta})
	if a.Key != key || a.Size != int64(len(body)) {
		t.Errorf("Put attrs = %q, %d bytes; want %q, %d", a.Key, a.Size, key, len(body))
	}
	got, ga := get(t, s, key)
	if got != body {
		t.Errorf("Get body = %q, want %q", got, body)
	}
	st, err := s.Stat(t.Context(), key)
	if err != nil {
		t.Fatalf("Stat: %v", err)
	}
	for name, a := range map[string]checkpoint.ObjectAttrs{"Get": ga, "Stat": st} {
		if a.Key != key || a.Size != int64(len(body)) || a.ContentType != "application/json" || !maps.Equal(a.Metadata, meta) {
			t.Errorf("%s attrs = %+v; want key %q, size %d, content type application/json, metadata %v",
				name, a, key, len(body), meta)
		}
		if a.Created.Before(start.Add(-time.Minute)) || a.Created.After(time.Now().Add(time.Minute)) {
			t.Errorf("%s created = %v, want about %v", name, a.Created, start)
		}
	}
}

func testEmptyObject(t *testing.T, s checkpoint.ObjectStore) {
	a := put(t, s, "empty", "", checkpoint.PutOptions{})
	if a.Size != 0 {
		t.Errorf("Put size = %d, want 0", a.Size)
	}
	if got, ga := get(t, s, "empty"); got != "" || ga.Size != 0 {
		t.Errorf("Get = %q, %d bytes; want empty", got, ga.Size)
	}
}

func testList(t *testing.T, s checkpoint.ObjectStore) {
	for _, k := range []string{"p/b/c", "p/a", "p/bb", "p-z", "q/x", "p/b/d/e"} {
		put(t, s, k, "body of "+k, checkpoint.PutOptions{})
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"", []string{"p-z", "p/a", "p/b/c", "p/b/d/e", "p/bb", "q/x"}},
		{"p/", []string{"p/a", "p/b/c", "p/b/d/e", "p/bb"}},
		{"p", []string{"p-z", "p/a", "p/b/c", "p/b/d/e", "p/bb"}},
		{"p/b", []string{"p/b/c", "p/b/d/e", "p/bb"}},
		{"p/b/", []string{"p/b/c", "p/b/d/e"}},
		{"p/b/d/e", []string{"p/b/d/e"}},
		{"q/x/", []string{}},
		{"none/", []string{}},
		{"none", []string{}},
	} {
		objs, err := s.List(t.Context(), tc.prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", tc.prefix, err)
		}
		if got := keys(objs); strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("List(%q) = %q, want %q", tc.prefix, got, tc.want)
		}
		for _, o := range objs {
			if o.Size != int64(len("body of "+o.Key)) {
				t.Errorf("List(%q): %s size = %d, want %d", tc.prefix, o.Key, o.Size, len("body of "+o.Key))
			}
		}
	}
}

func testIfNotExists(t *testing.T, s checkpoint.ObjectStore) {
	put(t, s, "k/one", "first", checkpoint.PutOptions{IfNotExists: true})
	_, err := s.Put(t.Context(), "k/one", strings.NewReader("second"), checkpoint.PutOptions{IfNotExists: true})
	if !errors.Is(err, checkpoint.ErrPrecondition) {
		t.Fatalf("second Put IfNotExists: got %v, want ErrPrecondition", err)
	}
	if got, _ := get(t, s, "k/one"); got != "first" {
		t.Errorf("after failed Put: got %q, want %q", got, "first")
	}
	objs, err := s.List(t.Context(), "k/")
	if err != nil {
		t.Fatal(err)
	}
	if got := keys(objs); len(got) != 1 {
		t.Errorf("List = %q, want only k/one", got)
	}
}

func testIfNotExistsRace(t *testing.T, s checkpoint.ObjectStore) {
	const writers = 8
	var (
		wg                  sync.WaitGroup
		mu                  sync.Mutex
		won, lost, failures int
		winner              string
	)
	for i := range writers {
		wg.Go(func() {
			body := strings.Repeat(string(rune('a'+i)), 64<<10)
			_, err := s.Put(t.Context(), "race/key", strings.NewReader(body), checkpoint.PutOptions{IfNotExists: true})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
				winner = body
			case errors.Is(err, checkpoint.ErrPrecondition):
				lost++
			default:
				failures++
				t.Errorf("Put: %v", err)
			}
		})
	}
	wg.Wait()
	if won != 1 || lost != writers-1-failures {
		t.Fatalf("got %d winners and %d ErrPrecondition, want 1 and %d", won, lost, writers-1)
	}
	if got, _ := get(t, s, "race/key"); got != winner {
		t.Errorf("stored body is not the winner's")
	}
}

func testOverwrite(t *testing.T, s checkpoint.ObjectStore) {
	put(t, s, "o/k", "one", checkpoint.PutOptions{ContentType: "text/plain", Metadata: map[string]string{"v": "1"}})
	a := put(t, s, "o/k", "second", checkpoint.PutOptions{})
	if a.Size != 6 {
		t.Errorf("Put size = %d, want 6", a.Size)
	}
	got, ga := get(t, s, "o/k")
	if got != "second" {
		t.Errorf("got %q, want %q", got, "second")
	}
	if ga.ContentType != "" || len(ga.Metadata) != 0 {
		t.Errorf("attrs = %q %v, want no content type and no metadata of the old version", ga.ContentType, ga.Metadata)
	}
}

// failingReader returns n bytes, then err.
type failingReader struct {
	n   int
	err error
}

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, r.err
	}
	k := min(len(p), r.n)
	for i := range p[:k] {
		p[i] = 'x'
	}
	r.n -= k
	return k, nil
}

var errBoom = errors.New("boom")

func testFailingReader(t *testing.T, s checkpoint.ObjectStore) {
	for _, ifNotExists := range []bool{false, true} {
		_, err := s.Put(t.Context(), "f/k", &failingReader{n: 3 << 20, err: errBoom}, checkpoint.PutOptions{IfNotExists: ifNotExists})
		if err == nil {
			t.Fatalf("Put with a failing reader (IfNotExists %v): got nil error, want one", ifNotExists)
		}
		wantNotExist(t, s, "f/k")
	}
}

func testFailingOverwriteKeepsOld(t *testing.T, s checkpoint.ObjectStore) {
	put(t, s, "f/k", "old", checkpoint.PutOptions{})
	if _, err := s.Put(t.Context(), "f/k", &failingReader{n: 1 << 20, err: errBoom}, checkpoint.PutOptions{}); err == nil {
		t.Fatal("Put with a failing reader: got nil error, want one")
	}
	if got, _ := get(t, s, "f/k"); got != "old" {
		t.Errorf("after a failed overwrite: got %q, want %q", got, "old")
	}
}

func testCancelledBefore(t *testing.T, s checkpoint.ObjectStore) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.Put(ctx, "c/k", strings.NewReader("body"), checkpoint.PutOptions{}); err == nil {
		t.Fatal("Put with a cancelled ctx: got nil error, want one")
	}
	wantNotExist(t, s, "c/k")
}

// cancellingReader cancels its context after n bytes and then keeps supplying data.
type cancellingReader struct {
	n      int
	cancel context.CancelFunc
	left   int
}

func (r *cancellingReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	k := min(len(p), r.left)
	r.left -= k
	if r.n -= k; r.n <= 0 {
		r.cancel()
	}
	return k, nil
}

func testCancelledMidway(t *testing.T, s checkpoint.ObjectStore) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	r := &cancellingReader{n: 1 << 20, cancel: cancel, left: 8 << 20}
	if _, err := s.Put(ctx, "c/k", r, checkpoint.PutOptions{}); err == nil {
		t.Fatal("Put cancelled midway: got nil error, want one")
	}
	wantNotExist(t, s, "c/k")
}

func testDelete(t *testing.T, s checkpoint.ObjectStore) {
	put(t, s, "d/a/k", "x", checkpoint.PutOptions{Metadata: map[string]string{"m": "1"}})
	put(t, s, "d/b", "y", checkpoint.PutOptions{})
	if err := s.Delete(t.Context(), "d/a/k"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	wantNotExist(t, s, "d/a/k")
	if err := s.Delete(t.Context(), "d/a/k"); !errors.Is(err, checkpoint.ErrNotExist) {
		t.Errorf("second Delete: got %v, want ErrNotExist", err)
	}
	if got, _ := get(t, s, "d/b"); got != "y" {
		t.Errorf("other object: got %q, want %q", got, "y")
	}
	// The key can be used again, and carries no metadata of the deleted object.
	put(t, s, "d/a/k", "z", checkpoint.PutOptions{IfNotExists: true})
	if got, a := get(t, s, "d/a/k"); got != "z" || len(a.Metadata) != 0 {
		t.Errorf("recreated object: got %q with metadata %v, want %q without", got, a.Metadata, "z")
	}
}

func testMissing(t *testing.T, s checkpoint.ObjectStore) {
	put(t, s, "m/present", "x", checkpoint.PutOptions{})
	for _, key := range []string{"m/absent", "m", "m/present/below"} {
		if _, _, err := s.Get(t.Context(), key); !errors.Is(err, checkpoint.ErrNotExist) {
			t.Errorf("Get(%q): got %v, want ErrNotExist", key, err)
		}
		if _, err := s.Stat(t.Context(), key); !errors.Is(err, checkpoint.ErrNotExist) {
			t.Errorf("Stat(%q): got %v, want ErrNotExist", key, err)
		}
		if err := s.Delete(t.Context(), key); !errors.Is(err, checkpoint.ErrNotExist) {
			t.Errorf("Delete(%q): got %v, want ErrNotExist", key, err)
		}
	}
}

// randReader yields n deterministic pseudo-random bytes.
type randReader struct {
	rng *rand.ChaCha8
	n   int64
}

func (r *randReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), r.n)]
	r.rng.Read(p)
	r.n -= int64(len(p))
	return len(p), nil
}

func testLarge(t *testing.T, s checkpoint.ObjectStore) {
	const size = 50 << 20
	seed := [32]byte{1, 2, 3}
	want := sha256.New()
	if _, err := io.Copy(want, &randReader{rng: rand.NewChaCha8(seed), n: size}); err != nil {
		t.Fatal(err)
	}
	a, err := s.Put(t.Context(), "large/obj", &randReader{rng: rand.NewChaCha8(seed), n: size}, checkpoint.PutOptions{})
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	if a.Size != size {
		t.Errorf("Put size = %d, want %d", a.Size, size)
	}
	rc, ga, err := s.Get(t.Context(), "large/obj")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	defer rc.Close()
	got := sha256.New()
	n, err := io.Copy(got, rc)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if n != size || ga.Size != size {
		t.Errorf("read %d bytes, attrs size %d; want %d", n, ga.Size, size)
	}
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Error("content differs from what was put")
	}
}
