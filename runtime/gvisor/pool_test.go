package gvisor_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"sandboxd/runtime"
	"sandboxd/runtime/gvisor"
	"sandboxd/runtime/runtimetest"
)

// poolIDs lists the ids ListPool returns.
func poolIDs(t *testing.T, d *gvisor.Driver) []string {
	t.Helper()
	boxes, err := d.ListPool(ctxT(t))
	if err != nil {
		t.Fatalf("ListPool: %v", err)
	}
	var ids []string
	for _, b := range boxes {
		ids = append(ids, b.Record.ID)
	}
	return ids
}

// indexed lists the pool index's entries.
func indexed(t *testing.T, idx string) []string {
	t.Helper()
	entries, err := os.ReadDir(idx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestPoolIndex: ListPool reads the records of the boxes the pool index names only (a
// sandbox's unreadable record does not trouble it), skips and removes entries of boxes that
// are gone or claimed, keeps the entry of a box whose create is writing its record, ignores
// what is not a plain entry, and the index is rebuilt from the records when a driver starts.
func TestPoolIndex(t *testing.T) {
	d := newDriver(t)
	stateDir := filepath.Dir(d.RootDir())
	idx := filepath.Join(stateDir, "pool")
	boxes := filepath.Join(stateDir, "boxes")

	rec := runtimetest.NewRecord(defaultSpec())
	rec.Tenant, rec.Project, rec.Pool = "", "", "default"
	if err := d.Create(ctxT(t), rec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Delete(ctxT(t), rec.ID) })
	if got := indexed(t, idx); !slices.Equal(got, []string{rec.ID}) {
		t.Fatalf("index after a pooled create: got %v, want [%s]", got, rec.ID)
	}

	// A sandbox whose record cannot be decoded: a listing of every box would fail on it.
	other := runtimetest.NewID()
	if err := os.MkdirAll(filepath.Join(boxes, other), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(boxes, other, "record.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Join(boxes, other)) })

	// Stale and odd entries: a box that is gone, a box whose create has not written its record
	// yet, a folder and a link named like boxes, a name that is no id.
	gone, creating, dirEntry, link := runtimetest.NewID(), runtimetest.NewID(), runtimetest.NewID(), runtimetest.NewID()
	for _, name := range []string{gone, creating, "not an id"} {
		if err := os.WriteFile(filepath.Join(idx, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(boxes, creating), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Join(boxes, creating)) })
	if err := os.Mkdir(filepath.Join(idx, dirEntry), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(boxes, rec.ID), filepath.Join(idx, link)); err != nil {
		t.Fatal(err)
	}

	if got := poolIDs(t, d); !slices.Equal(got, []string{rec.ID}) {
		t.Fatalf("ListPool: got %v, want [%s]", got, rec.ID)
	}
	got := indexed(t, idx)
	if slices.Contains(got, gone) {
		t.Errorf("the entry of a box that is gone was kept: %v", got)
	}
	if !slices.Contains(got, creating) {
		t.Errorf("the entry of a box being created was removed: %v", got)
	}

	// An entry lost (a state folder from before the index, a crash): the box is not listed
	// until a driver starts on the folder and rebuilds the index from the records.
	if err := os.Remove(filepath.Join(idx, rec.ID)); err != nil {
		t.Fatal(err)
	}
	if got := poolIDs(t, d); len(got) != 0 {
		t.Fatalf("ListPool without the entry: got %v, want none", got)
	}
	d2, err := gvisor.New(gvisor.Options{Runsc: components.runsc, StateDir: stateDir, InitBinary: components.init, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	for _, dr := range []*gvisor.Driver{d, d2} {
		if got := poolIDs(t, dr); !slices.Equal(got, []string{rec.ID}) {
			t.Fatalf("ListPool after the rebuild: got %v, want [%s]", got, rec.ID)
		}
	}

	// A look that changes nothing writes nothing (the claim's check under its lock); a change
	// is written (a new file renamed over the record).
	recordFile := filepath.Join(boxes, rec.ID, "record.json")
	inode := func() uint64 {
		fi, err := os.Stat(recordFile)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	ino := inode()
	if _, err := d.UpdatePool(ctxT(t), rec.ID, func(r *runtime.Record) error { _ = r.Annotations["x"]; return nil }); err != nil {
		t.Fatal(err)
	}
	if inode() != ino {
		t.Errorf("an UpdatePool that changed nothing rewrote the record")
	}
	if _, err := d.UpdatePool(ctxT(t), rec.ID, func(r *runtime.Record) error { r.Annotations["x"] = "1"; return nil }); err != nil {
		t.Fatal(err)
	}
	if inode() == ino {
		t.Errorf("an UpdatePool that changed the record did not write it")
	}

	// A claim takes the box out of the index; a claimer that died before removing the entry
	// leaves one that the next listing removes.
	claimed, err := d2.UpdatePool(ctxT(t), rec.ID, func(r *runtime.Record) error {
		r.Pool, r.Tenant, r.Project = "", "tenant-a", "project-a"
		return nil
	})
	if err != nil || claimed.Pool != "" {
		t.Fatalf("claim: %v (pool %q)", err, claimed.Pool)
	}
	if slices.Contains(indexed(t, idx), rec.ID) {
		t.Errorf("the claimed box is still in the index")
	}
	if _, err := d.Get(ctxT(t), rec.ID); err != nil {
		t.Errorf("Get of the claimed box: %v", err)
	}
	if err := os.WriteFile(filepath.Join(idx, rec.ID), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := poolIDs(t, d); len(got) != 0 {
		t.Errorf("ListPool after the claim: got %v, want none", got)
	}
	if slices.Contains(indexed(t, idx), rec.ID) {
		t.Errorf("the stale entry of the claimed box was kept")
	}
	if _, err := d.UpdatePool(ctxT(t), rec.ID, func(*runtime.Record) error { return nil }); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("a second claim: got %v, want ErrNotFound", err)
	}

	// Delete removes an entry the box still has.
	if err := os.WriteFile(filepath.Join(idx, rec.ID), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctxT(t), rec.ID); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(indexed(t, idx), rec.ID) {
		t.Errorf("Delete left the box's entry")
	}
}
