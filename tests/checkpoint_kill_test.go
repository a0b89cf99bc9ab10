package tests

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandboxd/tests/e2e"
)

// TestKillDuringCheckpointUpload: a replica SIGKILLed while it uploads a snapshot leaves the
// previous checkpoint whole and usable; the half-written one is never listed; another replica
// on the same state serves the sandbox, its next snapshot is complete, and a sandbox created
// from the earlier snapshot has that snapshot's files.
func TestKillDuringCheckpointUpload(t *testing.T) {
	st := e2e.NewStateDir(t)
	a := e2e.StartServer(t, e2e.ServerOptions{State: st})
	key := e2e.HdrTenant1
	id := a.Create(t, `{"profile":"sandboxes-default"}`, key).SandboxID
	a.Run(t, id, []string{"sh", "-c", "echo v1 > kept.txt"}, key)
	var first snapshotJSON
	r := a.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/snapshots", nil, key)
	r.Want(t, http.StatusCreated)
	r.Decode(t, &first)

	// An incompressible 200 MB file, so that the next upload takes a while.
	a.Run(t, id, []string{"sh", "-c", "head -c 200000000 /dev/urandom > big && echo v2 > kept.txt"}, key)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _, _ = a.SendContext(ctx, http.MethodPost, e2e.Prefix+"/"+id+"/snapshots", nil, key) }()
	folder := checkpointFolder(t, st, id)
	e2e.Eventually(t, 60*time.Second, "the second snapshot's upload to be under way", func() (bool, string) {
		if _, err := os.Stat(filepath.Join(folder, "0000000002.json")); err == nil {
			t.Fatal("the second snapshot finished before the kill; make its file bigger")
		}
		return uploading(folder) > 4<<20, "no temporary file over 4 MiB yet in " + folder
	})
	a.Kill(t)
	cancel()

	b := e2e.StartServer(t, e2e.ServerOptions{State: st})
	b.Track(id, key)
	snaps := listSnapshots(t, b, id, key).ids()
	if len(snaps) != 1 || snaps[0] != first.SnapshotID {
		t.Fatalf("snapshots after the kill: got %v, want only %s (the half-written one is not a snapshot)", snaps, first.SnapshotID)
	}
	// The sandbox goes on, and its next snapshot is complete.
	if out := b.Run(t, id, []string{"cat", "kept.txt"}, key); out != "v2\n" {
		t.Fatalf("the sandbox after the kill: kept.txt is %q, want v2", out)
	}
	// The killed replica's operation lock is still in the embedded Redis, which outlives it
	// (as a shared Redis would): the snapshot answers 409 with Retry-After until its lease
	// (lock_ttl_sec) lapses, then succeeds.
	e2e.Eventually(t, 60*time.Second, "a snapshot through the new replica", func() (bool, string) {
		r = b.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/snapshots", nil, key)
		if r.Status == http.StatusConflict && r.Header.Get("Retry-After") != "" {
			return false, r.String()
		}
		r.Want(t, http.StatusCreated)
		return true, ""
	})
	// The earlier snapshot is whole: a new sandbox restores it.
	c := b.Create(t, `{"profile":"sandboxes-default","source":{"snapshot_id":"`+first.SnapshotID+`"}}`, key).SandboxID
	if out := b.Run(t, c, []string{"sh", "-c", "cat kept.txt; ls big 2>/dev/null || echo no-big"}, key); out != "v1\nno-big\n" {
		t.Fatalf("created from %s: got %q, want v1 and no big file", first.SnapshotID, out)
	}
}

// checkpointFolder finds the local checkpoint folder of a sandbox.
func checkpointFolder(t *testing.T, st *e2e.StateDir, id string) string {
	t.Helper()
	var found string
	_ = filepath.WalkDir(st.Checkpoints, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() == id {
			found = p
			return filepath.SkipAll
		}
		return nil
	})
	if found == "" {
		t.Fatalf("no checkpoint folder of %s under %s", id, st.Checkpoints)
	}
	return found
}

// uploading returns the size of the largest unfinished upload (a temporary file) in folder.
func uploading(folder string) int64 {
	entries, _ := os.ReadDir(folder)
	var most int64
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".tmp-") {
			continue
		}
		if fi, err := e.Info(); err == nil {
			most = max(most, fi.Size())
		}
	}
	return most
}
