package checkpoint_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/checkpoint"
)

func newStore(t *testing.T, opts checkpoint.Options) (*checkpoint.Store, *checkpoint.LocalStore) {
	t.Helper()
	objs := newLocal(t)
	return checkpoint.New(objs, opts), objs
}

// smallTar returns a small generated tar and its entries.
func smallTar(t *testing.T, seed uint64) ([]byte, []genFile) {
	t.Helper()
	var buf bytes.Buffer
	entries, err := writeTar(&buf, seed, 20, 0, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), entries
}

func save(t *testing.T, st *checkpoint.Store, sc checkpoint.Scope, tarball []byte, parent string) checkpoint.Manifest {
	t.Helper()
	m, err := st.Save(t.Context(), sc, bytes.NewReader(tarball), parent)
	if err != nil {
		t.Fatalf("Save: %v", err)
	}
	return m
}

// readBack opens a checkpoint and reads it to the end; it returns the bytes' sha256 and the
// first error of Open or of the stream.
func readBack(t *testing.T, st *checkpoint.Store, sc checkpoint.Scope, id string) ([32]byte, error) {
	t.Helper()
	rc, _, err := st.Open(t.Context(), sc, id)
	if err != nil {
		return [32]byte{}, err
	}
	defer rc.Close()
	h := sha256.New()
	if _, err := io.Copy(h, rc); err != nil {
		return [32]byte{}, err
	}
	return [32]byte(h.Sum(nil)), nil
}

// objectKeys lists every object of the store.
func objectKeys(t *testing.T, objs checkpoint.ObjectStore) []string {
	t.Helper()
	list, err := objs.List(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	out := []string{}
	for _, o := range list {
		out = append(out, o.Key)
	}
	return out
}

func ids(ms []checkpoint.Manifest) []string {
	out := []string{}
	for _, m := range ms {
		out = append(out, m.ID)
	}
	return out
}

func TestSaveOpenRoundTrip(t *testing.T) {
	st, objs := newStore(t, checkpoint.Options{})
	sc := newScope()
	path, entries, rawSize, rawSum := tarFile(t, 1, 300, 0, 1<<20)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before := time.Now().UTC()
	m, err := st.Save(t.Context(), sc, f, "")
	if err != nil {
		t.Fatalf("Save: %v", err)
	}

	dir := "checkpoints/acme/web/" + sc.Sandbox + "/"
	want := checkpoint.Manifest{
		ID: "snap_" + strings.TrimPrefix(sc.Sandbox, "sbx_") + "_0000000001", Tenant: "acme", Project: "web",
		Sandbox: sc.Sandbox, N: 1, Object: dir + "0000000001.tar.zst", RawSize: rawSize, Format: "tar+zstd/v1",
	}
	got := m
	got.Size, got.SHA256, got.CreatedAt = 0, "", time.Time{}
	if got != want {
		t.Errorf("manifest = %+v\nwant %+v", got, want)
	}
	if m.CreatedAt.Before(before.Add(-time.Second)) || m.CreatedAt.After(time.Now().Add(time.Second)) {
		t.Errorf("created_at = %v, want about %v", m.CreatedAt, before)
	}
	if keys := objectKeys(t, objs); strings.Join(keys, ",") != dir+"0000000001.json,"+dir+"0000000001.tar.zst" {
		t.Errorf("objects = %q, want the manifest and the data object", keys)
	}
	// The manifest's size and hash are those of the stored object.
	data, err := os.ReadFile(filepath.Join(objs.Dir(), filepath.FromSlash(m.Object)))
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(data); int64(len(data)) != m.Size || hex.EncodeToString(sum[:]) != m.SHA256 {
		t.Errorf("object has %d bytes, sha256 %x; manifest says %d, %s", len(data), sum, m.Size, m.SHA256)
	}
	if m.Size >= rawSize {
		t.Errorf("compressed %d bytes into %d, want smaller", rawSize, m.Size)
	}
	// The manifest is stored as documented.
	mr, _, err := objs.Get(t.Context(), dir+"0000000001.json")
	if err != nil {
		t.Fatal(err)
	}
	var stored map[string]any
	if err := jsonDecode(mr, &stored); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"id", "tenant", "project", "sandbox", "n", "parent", "object", "size", "raw_size", "sha256", "created_at", "format"} {
		if _, ok := stored[k]; !ok {
			t.Errorf("manifest JSON lacks %q: %v", k, stored)
		}
	}

	// Open gives back the same tar stream, entry by entry.
	rc, om, err := st.Open(t.Context(), sc, m.ID)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if om != m {
		t.Errorf("Open manifest = %+v, want %+v", om, m)
	}
	if err := checkTar(rc, entries); err != nil {
		t.Errorf("tar read back: %v", err)
	}
	if err := rc.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if sum, err := readBack(t, st, sc, m.ID); err != nil || sum != rawSum {
		t.Errorf("read back: sha256 %x, %v; want %x", sum, err, rawSum)
	}
	if vm, err := st.Verify(t.Context(), sc, m.ID); err != nil || vm != m {
		t.Errorf("Verify = %+v, %v; want the manifest", vm, err)
	}
	if gm, err := st.Get(t.Context(), sc, m.ID); err != nil || gm != m {
		t.Errorf("Get = %+v, %v; want the manifest", gm, err)
	}
}

func TestSequenceAndParent(t *testing.T) {
	st, _ := newStore(t, checkpoint.Options{})
	sc := newScope()
	if _, err := st.Latest(t.Context(), sc); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("Latest of a new sandbox: got %v, want ErrNotFound", err)
	}
	if list, err := st.List(t.Context(), sc); err != nil || len(list) != 0 {
		t.Errorf("List of a new sandbox = %v, %v; want empty", list, err)
	}
	tarball, _ := smallTar(t, 2)
	var saved []checkpoint.Manifest
	parent := ""
	for i := 1; i <= 3; i++ {
		m := save(t, st, sc, tarball, parent)
		if m.N != int64(i) || m.Parent != parent {
			t.Errorf("checkpoint %d: n %d, parent %q; want %d, %q", i, m.N, m.Parent, i, parent)
		}
		if want := fmt.Sprintf("snap_%s_%010d", strings.TrimPrefix(sc.Sandbox, "sbx_"), i); m.ID != want {
			t.Errorf("checkpoint %d: id %q, want %q", i, m.ID, want)
		}
		saved = append(saved, m)
		parent = m.ID
	}
	list, err := st.List(t.Context(), sc)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(list), ids(saved); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("List = %q, want %q", got, want)
	}
	if l, err := st.Latest(t.Context(), sc); err != nil || l != saved[2] {
		t.Errorf("Latest = %+v, %v; want %+v", l, err, saved[2])
	}
	// A parent from another sandbox is fine; a malformed one is not.
	other := newScope()
	om := save(t, st, other, tarball, saved[2].ID)
	if om.N != 1 || om.Parent != saved[2].ID {
		t.Errorf("other sandbox: n %d, parent %q; want 1, %q", om.N, om.Parent, saved[2].ID)
	}
	if _, err := st.Save(t.Context(), sc, bytes.NewReader(tarball), "snap_bad"); !errors.Is(err, checkpoint.ErrInvalidID) {
		t.Errorf("Save with a malformed parent: got %v, want ErrInvalidID", err)
	}
}

func TestListProject(t *testing.T) {
	st, _ := newStore(t, checkpoint.Options{})
	tarball, _ := smallTar(t, 3)
	a, b := newScope(), newScope() // ULIDs sort by time: a < b
	other := checkpoint.Scope{Tenant: "acme", Project: "api", Sandbox: a.Sandbox}
	want := []string{save(t, st, a, tarball, "").ID, save(t, st, a, tarball, "").ID, save(t, st, b, tarball, "").ID}
	save(t, st, other, tarball, "")
	list, err := st.ListProject(t.Context(), "acme", "web")
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(list); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("ListProject = %q, want %q", got, want)
	}
	if _, err := st.ListProject(t.Context(), "acme", "../web"); !errors.Is(err, checkpoint.ErrInvalidScope) {
		t.Errorf("ListProject of a bad project: got %v, want ErrInvalidScope", err)
	}
}

func TestConcurrentSaves(t *testing.T) {
	st, _ := newStore(t, checkpoint.Options{})
	checkConcurrentSaves(t, st, 10)
}

// checkConcurrentSaves runs four Saves of one sandbox at once: each gets a number of its own
// and its own bytes back. seed varies the tars.
func checkConcurrentSaves(t *testing.T, st *checkpoint.Store, seed uint64) {
	t.Helper()
	sc := newScope()
	const writers = 4
	tarballs := make([][]byte, writers)
	for i := range tarballs {
		tarballs[i], _ = smallTar(t, seed+uint64(i))
	}
	results := make([]checkpoint.Manifest, writers)
	errs := make([]error, writers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			<-start
			results[i], errs[i] = st.Save(t.Context(), sc, bytes.NewReader(tarballs[i]), "")
		})
	}
	close(start)
	wg.Wait()
	seen := map[int64]bool{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Save %d: %v", i, err)
		}
		if seen[results[i].N] {
			t.Errorf("two Saves got n %d", results[i].N)
		}
		seen[results[i].N] = true
		if sum, err := readBack(t, st, sc, results[i].ID); err != nil || sum != sha256.Sum256(tarballs[i]) {
			t.Errorf("checkpoint %s: %v, or not the tar of Save %d", results[i].ID, err, i)
		}
	}
	if list, err := st.List(t.Context(), sc); err != nil || len(list) != writers {
		t.Errorf("List = %q, %v; want %d checkpoints", ids(list), err, writers)
	}
}

// staleList is an ObjectStore whose List answers nothing under prefix: like a listing
// taken before other Saves finished.
type staleList struct {
	checkpoint.ObjectStore
	prefix string
}

func (s staleList) List(ctx context.Context, prefix string) ([]checkpoint.ObjectAttrs, error) {
	if strings.HasPrefix(prefix, s.prefix) {
		return nil, nil
	}
	return s.ObjectStore.List(ctx, prefix)
}

func TestSaveSkipsNumbersInUse(t *testing.T) {
	st, objs := newStore(t, checkpoint.Options{})
	sc := newScope()
	tarball, _ := smallTar(t, 4)
	save(t, st, sc, tarball, "")
	save(t, st, sc, tarball, "")
	stale := checkpoint.New(staleList{objs, "checkpoints/"}, checkpoint.Options{})
	m, err := stale.Save(t.Context(), sc, bytes.NewReader(tarball), "")
	if err != nil {
		t.Fatalf("Save: %v", err)
	}
	if m.N != 3 {
		t.Errorf("n = %d, want 3 (1 and 2 are taken)", m.N)
	}
	if list, err := st.List(t.Context(), sc); err != nil || len(list) != 3 {
		t.Errorf("List = %q, %v; want 3 checkpoints", ids(list), err)
	}
	for _, k := range objectKeys(t, objs) {
		if strings.HasSuffix(k, ".claim") {
			t.Errorf("claim %s left behind", k)
		}
	}
}

// flip inverts the byte at off (from the end when negative) of the local file of key.
func flip(t *testing.T, objs *checkpoint.LocalStore, key string, off int64) {
	t.Helper()
	path, err := objs.Path(key)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if off < 0 {
		fi, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		off += fi.Size()
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func TestCorruptObject(t *testing.T) {
	tarball, _ := smallTar(t, 5)
	for _, tc := range []struct {
		name string
		off  int64 // from the end when negative
	}{
		{"MagicNumber", 0},
		{"FrameHeader", 5},
		{"Early", 100},
		{"Middle", -1 << 62}, // replaced below by the middle
		{"ChecksumTrailer", -1},
		{"LastBlock", -10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, objs := newStore(t, checkpoint.Options{})
			sc := newScope()
			m := save(t, st, sc, tarball, "")
			off := tc.off
			if off == -1<<62 {
				off = m.Size / 2
			}
			flip(t, objs, m.Object, off)
			if _, err := readBack(t, st, sc, m.ID); !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Errorf("reading: got %v, want ErrCorrupt", err)
			}
			if _, err := st.Verify(t.Context(), sc, m.ID); !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Errorf("Verify: got %v, want ErrCorrupt", err)
			}
		})
	}
}

func TestTruncatedObject(t *testing.T) {
	st, objs := newStore(t, checkpoint.Options{})
	sc := newScope()
	tarball, _ := smallTar(t, 6)
	m := save(t, st, sc, tarball, "")
	path, _ := objs.Path(m.Object)
	if err := os.Truncate(path, m.Size/2); err != nil {
		t.Fatal(err)
	}
	if _, err := readBack(t, st, sc, m.ID); !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Errorf("reading: got %v, want ErrCorrupt", err)
	}
	if _, err := st.Verify(t.Context(), sc, m.ID); !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Errorf("Verify: got %v, want ErrCorrupt", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := readBack(t, st, sc, m.ID); !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Errorf("reading without a data object: got %v, want ErrCorrupt", err)
	}
}

// shortReads is an ObjectStore whose Get reports the full size but ends the data early
// (as a broken connection or a store without sizes might).
type shortReads struct{ checkpoint.ObjectStore }

func (s shortReads) Get(ctx context.Context, key string) (io.ReadCloser, checkpoint.ObjectAttrs, error) {
	rc, a, err := s.ObjectStore.Get(ctx, key)
	if err != nil || !strings.HasSuffix(key, ".tar.zst") {
		return rc, a, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(rc, a.Size-1), rc}, a, nil
}

// longReads is an ObjectStore whose Get returns extra bytes after the data.
type longReads struct{ checkpoint.ObjectStore }

func (s longReads) Get(ctx context.Context, key string) (io.ReadCloser, checkpoint.ObjectAttrs, error) {
	rc, a, err := s.ObjectStore.Get(ctx, key)
	if err != nil || !strings.HasSuffix(key, ".tar.zst") {
		return rc, a, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(rc, strings.NewReader("trailing")), rc}, a, nil
}

func TestStreamChecksAtEOF(t *testing.T) {
	st, objs := newStore(t, checkpoint.Options{})
	sc := newScope()
	tarball, _ := smallTar(t, 7)
	m := save(t, st, sc, tarball, "")
	for name, o := range map[string]checkpoint.ObjectStore{"Short": shortReads{objs}, "Long": longReads{objs}} {
		t.Run(name, func(t *testing.T) {
			if _, err := readBack(t, checkpoint.New(o, checkpoint.Options{}), sc, m.ID); !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Errorf("reading: got %v, want ErrCorrupt", err)
			}
		})
	}
	// A valid zstd stream that is not the one the manifest describes.
	key := strings.TrimSuffix(m.Object, ".tar.zst") + ".json"
	for _, tc := range []struct {
		name       string
		edit       func(*checkpoint.Manifest)
		verifyFail bool // Verify checks only the stored bytes, not the tar size
	}{
		{"OtherHash", func(m *checkpoint.Manifest) { m.SHA256 = strings.Repeat("0", 64) }, true},
		{"LongerTar", func(m *checkpoint.Manifest) { m.RawSize++ }, false},
		{"ShorterTar", func(m *checkpoint.Manifest) { m.RawSize-- }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			edited := m
			tc.edit(&edited)
			if _, err := objs.Put(t.Context(), key, strings.NewReader(mustJSON(t, edited)), checkpoint.PutOptions{}); err != nil {
				t.Fatal(err)
			}
			defer objs.Put(context.WithoutCancel(t.Context()), key, strings.NewReader(mustJSON(t, m)), checkpoint.PutOptions{})
			if _, err := readBack(t, st, sc, m.ID); !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Errorf("reading: got %v, want ErrCorrupt", err)
			}
			if _, err := st.Verify(t.Context(), sc, m.ID); tc.verifyFail != errors.Is(err, checkpoint.ErrCorrupt) {
				t.Errorf("Verify: got %v, want ErrCorrupt %v", err, tc.verifyFail)
			}
		})
	}
}

func TestCorruptManifest(t *testing.T) {
	st, objs := newStore(t, checkpoint.Options{})
	sc := newScope()
	tarball, _ := smallTar(t, 8)
	m := save(t, st, sc, tarball, "")
	key := strings.TrimSuffix(m.Object, ".tar.zst") + ".json"
	for name, body := range map[string]string{
		"NotJSON":     "{",
		"OtherObject": strings.Replace(mustJSON(t, m), m.Object, "elsewhere", 1),
		"OtherFormat": strings.Replace(mustJSON(t, m), checkpoint.Format, "tar+gzip/v9", 1),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := objs.Put(t.Context(), key, strings.NewReader(body), checkpoint.PutOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Get(t.Context(), sc, m.ID); !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Errorf("Get: got %v, want ErrCorrupt", err)
			}
			if _, err := st.List(t.Context(), sc); !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Errorf("List: got %v, want ErrCorrupt", err)
			}
		})
	}
	// A corrupt checkpoint can still be deleted.
	if err := st.Delete(t.Context(), sc, m.ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if got := objectKeys(t, objs); len(got) != 0 {
		t.Errorf("objects after Delete = %q, want none", got)
	}
}

func TestEmptyStream(t *testing.T) {
	st, _ := newStore(t, checkpoint.Options{})
	sc := newScope()
	m := save(t, st, sc, nil, "")
	if m.RawSize != 0 || m.Size == 0 {
		t.Errorf("sizes = %d raw, %d stored; want 0 raw and a zstd frame", m.RawSize, m.Size)
	}
	if sum, err := readBack(t, st, sc, m.ID); err != nil || sum != sha256.Sum256(nil) {
		t.Errorf("read back: %x, %v; want the empty stream", sum, err)
	}
}

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
	if got := objectKeys(t, objs); len(got) != 2 || got[1] != all[3].Object {
		t.Errorf("objects after Retain(0, protect) = %q, want only checkpoint 4", got)
	}
	if _, err := st.Retain(t.Context(), sc, 0); err != nil {
		t.Fatal(err)
	}
	if got := objectKeys(t, objs); len(got) != 0 {
		t.Errorf("objects after Retain(0) = %q, want none", got)
	}
}

// tarThenFail yields the first n bytes of a tar stream, then err.
func tarThenFail(tarball []byte, n int, err error) io.Reader {
	return io.MultiReader(bytes.NewReader(tarball[:n]), errReader{err})
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

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

// cancelReader cancels when first read, and then reads nothing.
type cancelReader struct{ cancel context.CancelFunc }

func (r cancelReader) Read([]byte) (int, error) {
	r.cancel()
	return 0, io.EOF
}

func TestInvalidScope(t *testing.T) {
	st, _ := newStore(t, checkpoint.Options{})
	good := newScope()
	for _, sc := range []checkpoint.Scope{
		{Tenant: "", Project: "web", Sandbox: good.Sandbox},
		{Tenant: "acme", Project: "a/b", Sandbox: good.Sandbox},
		{Tenant: "..", Project: "web", Sandbox: good.Sandbox},
		{Tenant: "acme", Project: "web", Sandbox: "sbx_short"},
		{Tenant: "acme", Project: "web", Sandbox: strings.ToLower(good.Sandbox)},
		{Tenant: "acme", Project: "web", Sandbox: strings.TrimPrefix(good.Sandbox, "sbx_")},
	} {
		_, err := st.Save(t.Context(), sc, strings.NewReader(""), "")
		if !errors.Is(err, checkpoint.ErrInvalidScope) || apierror.CodeOf(err) != apierror.InvalidArgument {
			t.Errorf("Save(%+v): got %v, want ErrInvalidScope (INVALID_ARGUMENT)", sc, err)
		}
		if _, err := st.List(t.Context(), sc); !errors.Is(err, checkpoint.ErrInvalidScope) {
			t.Errorf("List(%+v): got %v, want ErrInvalidScope", sc, err)
		}
	}
}

func TestParseID(t *testing.T) {
	const u = "01JXYZ8V6Q2W3E4R5T6Y7V8W9X"
	for _, tc := range []struct {
		id      string
		sandbox string
		n       int64
		ok      bool
	}{
		{"snap_" + u + "_0000000003", "sbx_" + u, 3, true},
		{"snap_" + u + "_0000000001", "sbx_" + u, 1, true},
		{"snap_" + u + "_9999999999", "sbx_" + u, 9999999999, true},
		{"snap_" + u + "_0000000000", "", 0, false},
		{"", "", 0, false},
		{"snap_", "", 0, false},
		{"sbx_" + u + "_0000000003", "", 0, false},
		{"snp_" + u + "_0000000003", "", 0, false},
		{"snap_" + strings.ToLower(u) + "_0000000003", "", 0, false},
		{"snap_" + u[:25] + "_0000000003", "", 0, false},
		{"snap_" + u + "0000000003", "", 0, false},
		{"snap_" + u + "-0000000003", "", 0, false},
		{"snap_" + u + "_000000003", "", 0, false},
		{"snap_" + u + "_00000000003", "", 0, false},
		{"snap_" + u + "_+000000003", "", 0, false},
		{"snap_" + u + "_00000000a3", "", 0, false},
		{"snap_" + u + "_0000000003 ", "", 0, false},
		{"snap_" + u + "_0000000003/..", "", 0, false},
		{"snap_8" + u[1:] + "_0000000003", "", 0, false}, // ULID overflow
		{"snap_" + u[:10] + "IL" + u[12:] + "_0000000003", "", 0, false},
	} {
		sandbox, n, err := checkpoint.ParseID(tc.id)
		if tc.ok {
			if err != nil || sandbox != tc.sandbox || n != tc.n {
				t.Errorf("ParseID(%q) = %q, %d, %v; want %q, %d, nil", tc.id, sandbox, n, err, tc.sandbox, tc.n)
			}
			continue
		}
		if !errors.Is(err, checkpoint.ErrInvalidID) || apierror.CodeOf(err) != apierror.InvalidArgument {
			t.Errorf("ParseID(%q) = %q, %d, %v; want ErrInvalidID (INVALID_ARGUMENT)", tc.id, sandbox, n, err)
		}
	}
}

func TestGetRefusesMalformedID(t *testing.T) {
	st, _ := newStore(t, checkpoint.Options{})
	if _, err := st.Get(t.Context(), newScope(), "snap_../../x"); !errors.Is(err, checkpoint.ErrInvalidID) {
		t.Errorf("Get: got %v, want ErrInvalidID", err)
	}
}

func jsonDecode(rc io.ReadCloser, v any) error {
	defer rc.Close()
	return json.NewDecoder(rc).Decode(v)
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
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
