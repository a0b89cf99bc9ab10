package checkpoint_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/checkpoint"
)

func TestOrphansAndGC(t *testing.T) {
	now := time.Now()
	clock := func() time.Time { return now }
	st, objs := newStore(t, checkpoint.Options{GCGrace: time.Hour, Now: clock})
	sc := newScope()
	tarball, _ := smallTar(t, 9)
	first := save(t, st, sc, tarball, "")
	dir := "checkpoints/acme/web/" + sc.Sandbox + "/"
	// The remains of crashed Saves: a data object without a manifest, and a claim.
	for _, k := range []string{"0000000002.tar.zst", "0000000003.claim", "0000000001.claim"} {
		if _, err := objs.Put(t.Context(), dir+k, strings.NewReader("partial"), checkpoint.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	list, err := st.List(t.Context(), sc)
	if err != nil || len(list) != 1 || list[0] != first {
		t.Errorf("List = %q, %v; want only %s", ids(list), err, first.ID)
	}
	if l, err := st.Latest(t.Context(), sc); err != nil || l != first {
		t.Errorf("Latest = %q, %v; want %s", l.ID, err, first.ID)
	}
	orphan := strings.Replace(first.ID, "_0000000001", "_0000000002", 1)
	if _, err := st.Get(t.Context(), sc, orphan); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("Get of the orphan: got %v, want ErrNotFound", err)
	}
	if err := st.Delete(t.Context(), sc, orphan); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("Delete of the orphan: got %v, want ErrNotFound", err)
	}
	// A new Save does not reuse numbers in use.
	if m := save(t, st, sc, tarball, first.ID); m.N != 4 {
		t.Errorf("next n = %d, want 4", m.N)
	}
	// Within the grace period GC removes only the claim of a complete checkpoint, and the Save
	// above already ran it.
	for _, k := range objectKeys(t, objs) {
		if k == dir+"0000000001.claim" {
			t.Errorf("after a Save, the stale claim of the complete checkpoint 1 is still there")
		}
	}
	removed, err := st.GC(t.Context(), sc)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 0 {
		t.Errorf("GC within the grace period removed %q, want nothing more", removed)
	}
	now = now.Add(2 * time.Hour)
	removed, err = st.GC(t.Context(), sc)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(removed, ","), dir+"0000000002.tar.zst,"+dir+"0000000003.claim"; got != want {
		t.Errorf("GC removed %q, want %q", got, want)
	}
	want := []string{dir + "0000000001.json", dir + "0000000001.tar.zst", dir + "0000000004.json", dir + "0000000004.tar.zst"}
	if got := objectKeys(t, objs); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("objects after GC = %q, want %q", got, want)
	}
}

func TestDelete(t *testing.T) {
	st, objs := newStore(t, checkpoint.Options{})
	sc := newScope()
	tarball, _ := smallTar(t, 10)
	m1 := save(t, st, sc, tarball, "")
	m2 := save(t, st, sc, tarball, m1.ID)
	if err := st.Delete(t.Context(), newScope(), m1.ID); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("Delete from another sandbox: got %v, want ErrNotFound", err)
	}
	otherTenant := sc
	otherTenant.Tenant = "evil"
	if err := st.Delete(t.Context(), otherTenant, m1.ID); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("Delete from another tenant: got %v, want ErrNotFound", err)
	}
	if err := st.Delete(t.Context(), sc, m1.ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := st.Get(t.Context(), sc, m1.ID); !errors.Is(err, checkpoint.ErrNotFound) || apierror.CodeOf(err) != apierror.NotFound {
		t.Errorf("Get after Delete: got %v (code %s), want ErrNotFound (NOT_FOUND)", err, apierror.CodeOf(err))
	}
	if err := st.Delete(t.Context(), sc, m1.ID); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("second Delete: got %v, want ErrNotFound", err)
	}
	if got := objectKeys(t, objs); len(got) != 2 || got[1] != m2.Object {
		t.Errorf("objects = %q, want only checkpoint 2", got)
	}
}

func TestRetain(t *testing.T) {
	st, objs := newStore(t, checkpoint.Options{})
	sc := newScope()
	tarball, _ := smallTar(t, 11)
	var all []checkpoint.Manifest
	for range 5 {
		all = append(all, save(t, st, sc, tarball, ""))
	}
	if _, err := st.Retain(t.Context(), sc, -1); err == nil {
		t.Error("Retain(-1): got nil error, want one")
	}
	if deleted, err := st.Retain(t.Context(), sc, 5); err != nil || len(deleted) != 0 {
		t.Errorf("Retain(5) deleted %q, %v; want nothing", ids(deleted), err)
	}
	deleted, err := st.Retain(t.Context(), sc, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(deleted), ids(all[:3]); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("Retain(2) deleted %q, want %q", got, want)
	}
	list, err := st.List(t.Context(), sc)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(list), ids(all[3:]); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("List after Retain(2) = %q, want %q", got, want)
	}
	if got := objectKeys(t, objs); len(got) != 4 {
		t.Errorf("objects = %q, want the 2 manifests and 2 data objects", got)
	}
	// A protected checkpoint survives even when it is not among the newest.
	deleted, err = st.Retain(t.Context(), sc, 0, all[3].ID)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(deleted), ids(all[4:]); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("Retain(0, protect %s) deleted %q, want %q", all[3].ID, got, want)
	}
	// The newest deleted keeps its number taken (a tombstone).
	tomb5 := strings.TrimSuffix(all[4].Object, ".tar.zst") + ".deleted"
	if got := objectKeys(t, objs); len(got) != 3 || got[1] != all[3].Object || got[2] != tomb5 {
		t.Errorf("objects after Retain(0, protect) = %q, want only checkpoint 4 and the tombstone of 5", got)
	}
	if _, err := st.Retain(t.Context(), sc, 0); err != nil {
		t.Fatal(err)
	}
	if got := objectKeys(t, objs); len(got) != 1 || got[0] != tomb5 {
		t.Errorf("objects after Retain(0) = %q, want the tombstone of 5 alone", got)
	}
}

func TestFailedSaveLeavesNothing(t *testing.T) {
	errBoom := errors.New("boom")
	var big bytes.Buffer
	if _, err := writeTar(&big, 12, 0, 4<<20, 1<<20); err != nil {
		t.Fatal(err)
	}
	tarball := big.Bytes()
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, st *checkpoint.Store, sc checkpoint.Scope) error
		want error
	}{
		{"ReaderFailsMidway", func(t *testing.T, st *checkpoint.Store, sc checkpoint.Scope) error {
			_, err := st.Save(t.Context(), sc, tarThenFail(tarball, len(tarball)/2, errBoom), "")
			return err
		}, errBoom},
		{"ReaderFailsAtOnce", func(t *testing.T, st *checkpoint.Store, sc checkpoint.Scope) error {
			_, err := st.Save(t.Context(), sc, errReader{errBoom}, "")
			return err
		}, errBoom},
		{"CancelledMidway", func(t *testing.T, st *checkpoint.Store, sc checkpoint.Scope) error {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			r := io.MultiReader(bytes.NewReader(tarball[:len(tarball)/2]), cancelReader{cancel}, bytes.NewReader(tarball[len(tarball)/2:]))
			_, err := st.Save(ctx, sc, r, "")
			return err
		}, context.Canceled},
		{"CancelledBefore", func(t *testing.T, st *checkpoint.Store, sc checkpoint.Scope) error {
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			_, err := st.Save(ctx, sc, bytes.NewReader(tarball), "")
			return err
		}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, objs := newStore(t, checkpoint.Options{})
			sc := newScope()
			if err := tc.run(t, st, sc); !errors.Is(err, tc.want) {
				t.Fatalf("Save: got %v, want %v", err, tc.want)
			}
			if got := objectKeys(t, objs); len(got) != 0 {
				t.Errorf("objects after a failed Save = %q, want none", got)
			}
			if list, err := st.List(t.Context(), sc); err != nil || len(list) != 0 {
				t.Errorf("List = %q, %v; want empty", ids(list), err)
			}
			// The sandbox can still be saved, as checkpoint 1.
			if m := save(t, st, sc, tarball, ""); m.N != 1 {
				t.Errorf("next Save: n %d, want 1", m.N)
			}
		})
	}
}

// TestSaveRemovesWhatAKilledSaveLeft: a process killed mid-upload leaves a claim, perhaps a
// data object without manifest, and (local folder) a temporary file; the next Save of the
// sandbox removes those once they are older than the grace period, never a complete
// checkpoint and never a young temporary file (an upload in flight).
func TestSaveRemovesWhatAKilledSaveLeft(t *testing.T) {
	now := time.Now()
	clock := func() time.Time { return now }
	st, objs := newStore(t, checkpoint.Options{GCGrace: time.Hour, Now: clock})
	sc := newScope()
	tarball, _ := smallTar(t, 21)
	first := save(t, st, sc, tarball, "")
	dir := path.Dir(first.Object)
	old := now.Add(-2 * time.Hour)
	for _, key := range []string{dir + "/0000000002.claim", dir + "/0000000002.tar.zst"} {
		if _, err := objs.Put(t.Context(), key, strings.NewReader("partial"), checkpoint.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		p, _ := objs.Path(key)
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	folder, _ := objs.Path(dir)
	stale, fresh := filepath.Join(folder, ".tmp-killed"), filepath.Join(folder, ".tmp-inflight")
	for _, p := range []string{stale, fresh} {
		if err := os.WriteFile(p, []byte("half an upload"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	next := save(t, st, sc, tarball, first.ID)
	if next.N != 3 {
		t.Fatalf("the next Save got number %d, want 3 (2 was claimed)", next.N)
	}
	got := objectKeys(t, objs)
	for _, k := range got {
		if strings.Contains(k, "0000000002") {
			t.Errorf("the killed Save's %s is still there", k)
		}
	}
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the stale temporary file is still there (%v)", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a young temporary file (an upload in flight) was removed: %v", err)
	}
	for _, m := range []checkpoint.Manifest{first, next} {
		if _, err := st.Verify(t.Context(), sc, m.ID); err != nil {
			t.Errorf("checkpoint %s after the cleanup: %v", m.ID, err)
		}
	}
}

// TestSaveRemovesALoneTempFile: a process killed before its claim was written leaves only a
// temporary file, which no listing shows; Saves collect it every 16 sequence numbers.
func TestSaveRemovesALoneTempFile(t *testing.T) {
	now := time.Now()
	st, objs := newStore(t, checkpoint.Options{GCGrace: time.Hour, Now: func() time.Time { return now }})
	sc := newScope()
	tarball, _ := smallTar(t, 22)
	first := save(t, st, sc, tarball, "")
	folder, _ := objs.Path(path.Dir(first.Object))
	stale := filepath.Join(folder, ".tmp-killed-before-its-claim")
	if err := os.WriteFile(stale, []byte("half a claim"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := now.Add(-2 * time.Hour)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	for range 15 {
		save(t, st, sc, tarball, "")
	}
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after 16 Saves the stale temporary file is still there (%v)", err)
	}
}
