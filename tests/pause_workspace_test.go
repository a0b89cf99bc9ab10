package tests

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"sandboxd/tests/e2e"
)

// A pause whose workspace has not changed since the latest checkpoint a pause took keeps that
// checkpoint (the same latest_snapshot_id, no new snapshot); any change in between, even one
// still in the host's page cache at the pause or a mode alone, gets a checkpoint of its own;
// and a latest snapshot deleted in between (its sandbox RUNNING) is never stood for by an older
// one.
func TestPauseKeepsAnUnchangedWorkspacesCheckpoint(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	key := e2e.HdrTenant1
	id := s.Create(t, e2e.CreateBody, key).SandboxID
	if why := noWorkspaceVersion(filepath.Join(s.State.Dir, "boxes", id, "disk")); why != "" {
		t.Skipf("this host cannot tell a workspace unchanged (every pause checkpoints): %s", why)
	}
	s.Run(t, id, []string{"sh", "-c", "echo a > a.txt"}, key)
	runDetached(t, s, id, key, "sh", "-c", counterLoop) // writes /tmp, never /workspace
	snaps := func() []string { return listSnapshots(t, s, id, key).ids() }
	// pauseResume pauses the sandbox, resumes it and returns the pause's latest snapshot.
	pauseResume := func() string {
		t.Helper()
		p := pauseVerb(t, s, id, "pause", key)
		if p.State != "PAUSED" || p.LatestSnapshotID == "" || p.StateReason != "" {
			t.Fatalf("pause: %s %q snapshot %q", p.State, p.StateReason, p.LatestSnapshotID)
		}
		if r := pauseVerb(t, s, id, "resume", key); r.State != "RUNNING" || r.StateReason != "" {
			t.Fatalf("resume: %s %q", r.State, r.StateReason)
		}
		return p.LatestSnapshotID
	}

	settled := pauseResume()
	before := snaps()
	var kept string
	e2e.Step(t, "unchanged", func(t *testing.T) {
		if kept = pauseResume(); kept != settled {
			t.Fatalf("a pause of an unchanged workspace took %s, want the latest %s kept", kept, settled)
		}
		if after := snaps(); !slices.Equal(after, before) {
			t.Fatalf("snapshots after a pause of an unchanged workspace: %v, want %v", after, before)
		}
		if !s.LogContains("workspace unchanged since its latest checkpoint") {
			t.Fatal("the server did not say the workspace was unchanged")
		}
	})

	latest := kept
	for _, change := range []struct{ name, script string }{
		// Read back at once: in the host's page cache, not on the disk, at the pause.
		{"a write", "echo b > b.txt; cat b.txt"},
		{"a mode alone", "chmod 600 a.txt"},
		{"a removal", "touch c.txt; sync; rm c.txt"},
	} {
		e2e.Step(t, change.name, func(t *testing.T) {
			s.Run(t, id, []string{"sh", "-c", change.script}, key)
			got := pauseResume()
			if got == latest {
				t.Fatalf("a pause after %s kept the snapshot %s from before it", change.name, latest)
			}
			latest = got
		})
	}

	e2e.Step(t, "deleted-latest", func(t *testing.T) {
		// A change and its checkpoint, deleted while the sandbox runs: the newest one left
		// (from before the change) becomes its latest; the next pause must not let it stand
		// for the workspace, which has not changed since the deleted one.
		s.Run(t, id, []string{"sh", "-c", "echo d > d.txt"}, key)
		deleted := pauseResume()
		s.Curl(t, http.MethodDelete, e2e.Prefix+"/snapshots/"+deleted, nil, key).Want(t, http.StatusOK)
		older := s.Get(t, id, key).LatestSnapshotID
		if older == deleted || older == "" {
			t.Fatalf("after deleting the latest snapshot %s the sandbox's latest is %q", deleted, older)
		}
		// A new one, whose id is not the deleted one's either (a deleted id never names
		// another snapshot).
		got := pauseResume()
		if got == older || got == deleted || !slices.Contains(snaps(), got) {
			t.Fatalf("the pause after the latest snapshot's deletion named %s (deleted %s, older %s; snapshots %v), want a new one", got, deleted, older, snaps())
		}
		s.Curl(t, http.MethodDelete, e2e.Prefix+"/snapshots/"+deleted, nil, key).WantError(t, http.StatusNotFound, "NOT_FOUND")
		latest = got // what it holds is checked below
	})

	e2e.Step(t, "contents", func(t *testing.T) {
		check := func(snap, want string) {
			t.Helper()
			c := s.Create(t, `{"profile":"sandboxes-default","source":{"snapshot_id":"`+snap+`"}}`, key).SandboxID
			defer func() { s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+c, nil, key).Want(t, http.StatusOK) }()
			if got := s.Run(t, c, []string{"sh", "-c", "stat -c '%n %a' *.txt"}, key); got != want {
				t.Fatalf("the workspace of snapshot %s: %q, want %q", snap, got, want)
			}
		}
		check(kept, "a.txt 644\n")
		check(latest, "a.txt 600\nb.txt 644\nd.txt 644\n")
	})
}

// noWorkspaceVersion says why the local runtime has no workspace version for the disk mounted
// at mnt on this host ("" when it has one): a kernel before 6.8 (no unique mount ids) or a
// loop device without I/O statistics.
func noWorkspaceVersion(mnt string) string {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, mnt, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID_UNIQUE, &stx); err != nil {
		return err.Error()
	}
	if stx.Mask&unix.STATX_MNT_ID_UNIQUE == 0 {
		return "the kernel has no unique mount ids (Linux 6.8+)"
	}
	b, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/queue/iostats", stx.Dev_major, stx.Dev_minor))
	if err != nil {
		return err.Error()
	}
	if strings.TrimSpace(string(b)) != "1" {
		return "the disk's loop device keeps no I/O statistics"
	}
	return ""
}
