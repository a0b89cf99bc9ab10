package checkpoint_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/checkpoint"
)

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

func TestDerive(t *testing.T) {
	st, objs := newStore(t, checkpoint.Options{})
	mem := st.Derive("memory/")
	tarball, _ := smallTar(t, 5)
	sc := newScope()
	ws := save(t, st, sc, tarball, "")
	img := save(t, mem, sc, tarball, "")
	// The derived store's objects live under its prefix, beside the checkpoints, and each
	// store lists only its own.
	if !strings.HasPrefix(img.Object, "memory/acme/web/"+sc.Sandbox+"/") {
		t.Errorf("derived object %q, want it under memory/", img.Object)
	}
	for _, tc := range []struct {
		st   *checkpoint.Store
		want string
	}{{st, ws.ID}, {mem, img.ID}} {
		list, err := tc.st.List(t.Context(), sc)
		if err != nil || len(list) != 1 || list[0].ID != tc.want || list[0].Object == "" {
			t.Errorf("List: got %+v, %v, want only %s", list, err, tc.want)
		}
	}
	if list, err := st.ListProject(t.Context(), "acme", "web"); err != nil || len(list) != 1 {
		t.Errorf("ListProject of the checkpoints: got %d, %v, want only the checkpoint", len(list), err)
	}
	// Reads are checked as the checkpoints' are: a flipped byte is ErrCorrupt at the end.
	if sum, err := readBack(t, mem, sc, img.ID); err != nil || sum != sha256.Sum256(tarball) {
		t.Errorf("read back: %x, %v", sum, err)
	}
	path := filepath.Join(objs.Dir(), filepath.FromSlash(img.Object))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readBack(t, mem, sc, img.ID); !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Errorf("read of a flipped byte: got %v, want ErrCorrupt", err)
	}
	if _, err := readBack(t, st, sc, ws.ID); err != nil {
		t.Errorf("the checkpoint beside it: %v", err)
	}
}

// A deleted checkpoint's id never names another one: the newest deleted leaves a tombstone
// that keeps its number taken (by Delete, and by Retain with nothing kept), which GC removes
// once a higher number exists. A Delete of a checkpoint that does not exist leaves nothing (a
// made-up number must not take the numbers up to it). A derived store's numbers are given
// again, and its deletions leave nothing.
func TestDeletedNumbersAreNotGivenAgain(t *testing.T) {
	st, objs := newStore(t, checkpoint.Options{})
	sc := newScope()
	tarball, _ := smallTar(t, 3)
	save(t, st, sc, tarball, "")
	m2 := save(t, st, sc, tarball, "")
	if err := st.Delete(t.Context(), sc, m2.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(t.Context(), sc, m2.ID); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("Get of a deleted checkpoint: %v, want ErrNotFound", err)
	}
	if l, err := st.Latest(t.Context(), sc); err != nil || l.N != 1 {
		t.Fatalf("Latest after deleting the newest: %+v, %v; want number 1", l, err)
	}
	if removed, err := st.GC(t.Context(), sc); err != nil || len(removed) != 0 {
		t.Fatalf("GC while the tombstone is the highest number: removed %v, %v; want nothing", removed, err)
	}
	m3 := save(t, st, sc, tarball, "")
	if m3.N != 3 || m3.ID == m2.ID {
		t.Fatalf("the Save after deleting number 2 took number %d (%s)", m3.N, m3.ID)
	}
	if removed, err := st.GC(t.Context(), sc); err != nil || len(removed) != 1 || !strings.HasSuffix(removed[0], "0000000002.deleted") {
		t.Fatalf("GC with a higher number: removed %v, %v; want the tombstone of 2", removed, err)
	}

	// Retain with nothing kept deletes the newest too: its number stays taken.
	if deleted, err := st.Retain(t.Context(), sc, 0); err != nil || len(deleted) != 2 {
		t.Fatalf("Retain(0): %v, %v", deleted, err)
	}
	if m := save(t, st, sc, tarball, ""); m.N != 4 {
		t.Fatalf("the Save after Retain(0) took number %d, want 4", m.N)
	}

	// A made-up number: NOT_FOUND, and it takes nothing.
	bogus := fmt.Sprintf("snap_%s_%010d", strings.TrimPrefix(sc.Sandbox, "sbx_"), 9_000_000_000)
	if err := st.Delete(t.Context(), sc, bogus); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("Delete of a checkpoint that never was: %v, want ErrNotFound", err)
	}
	if m := save(t, st, sc, tarball, ""); m.N != 5 {
		t.Fatalf("the Save after deleting a made-up number took number %d, want 5", m.N)
	}

	mem := st.Derive("memory")
	d1 := save(t, mem, sc, tarball, "")
	if err := mem.Delete(t.Context(), sc, d1.ID); err != nil {
		t.Fatal(err)
	}
	for _, k := range objectKeys(t, objs) {
		if strings.HasPrefix(k, "memory/") {
			t.Fatalf("a derived store's deletion left %s", k)
		}
	}
	if d := save(t, mem, sc, tarball, ""); d.N != 1 {
		t.Fatalf("a derived store's Save after its deletion took number %d, want 1", d.N)
	}
}
