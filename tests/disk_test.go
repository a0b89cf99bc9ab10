package tests

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sandboxd/internal/source/sourcetest"
	"sandboxd/tests/e2e"
)

// Disks: on the local runtime every sandbox's workspace is an ext4 file system of its profile's
// disk_mb (a sparse image on a loop device): writes past it fail with ENOSPC, the host keeps at
// most disk_mb of it, df inside shows it, and a source larger than it is refused.

// smallDiskMB is the disk of the "small-disk" profile of diskServer.
const smallDiskMB = 64

// diskSlackBytes is what the host may keep of a box's disk beyond disk_mb: the host file
// system's bookkeeping of the image file (a few KiB); 1 MiB is generous.
const diskSlackBytes = 1 << 20

// diskServer starts a server whose profiles are the harness's default and "small-disk".
func diskServer(t *testing.T, extra map[string]any) *e2e.Server {
	t.Helper()
	cfg := map[string]any{
		"profiles": []map[string]any{
			{"name": "sandboxes-default", "rootfs": e2e.Rootfs(), "milli_cpu": 1000, "memory_mb": 1024},
			{"name": "small-disk", "description": "a 64 MiB disk", "rootfs": e2e.Rootfs(),
				"milli_cpu": 1000, "memory_mb": 512, "disk_mb": smallDiskMB},
		},
		"quota": map[string]any{"default_limit": 10},
	}
	for k, v := range extra {
		cfg[k] = v
	}
	return e2e.StartServer(t, e2e.ServerOptions{Extra: cfg})
}

// boxDir is the local runtime's folder of a sandbox.
func boxDir(s *e2e.Server, id string) string { return filepath.Join(s.State.Dir, "boxes", id) }

// wantNoDisk fails the test unless nothing is mounted under dir and no loop device backs onto a
// file there (a loop device is freed right after its unmount; the check allows it a moment).
func wantNoDisk(t *testing.T, dir string) {
	t.Helper()
	e2e.Eventually(t, 5*time.Second, "no mount and no loop device under "+dir, func() (bool, string) {
		m, l := e2e.MountsUnder(dir), e2e.LoopsBacking(dir)
		return len(m) == 0 && len(l) == 0, fmt.Sprintf("mounts %q, loop devices %q", m, l)
	})
}

// hostBytes is the space a file takes on the host (st_blocks, as du counts it).
func hostBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestDiskLimit: a sandbox of a 64 MiB profile that writes 200 MiB gets ENOSPC; the host keeps
// at most 64 MiB (plus the documented slack) of it; df inside shows the disk; a stop keeps the
// disk mounted for the next start; destroy leaves no mount and no loop device behind.
func TestDiskLimit(t *testing.T) {
	s := diskServer(t, nil)
	key := e2e.HdrTenant1
	sb := s.Create(t, `{"profile":"small-disk"}`, key)
	id := sb.SandboxID
	box := boxDir(s, id)
	limit := int64(smallDiskMB << 20)

	e2e.Step(t, "df-shows-the-disk", func(t *testing.T) {
		out := s.Run(t, id, []string{"df", "-B1", "--output=size,avail", "/workspace"}, key)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		f := strings.Fields(lines[len(lines)-1])
		size, err := strconv.ParseInt(f[0], 10, 64)
		// ext4's own metadata (journal, inode tables) is not counted in df's size.
		if err != nil || size > limit || size < limit*8/10 {
			t.Errorf("df -B1 /workspace: got %q, want a size of at most %d and at least 80%% of it", out, limit)
		}
	})

	e2e.Step(t, "fill-gets-ENOSPC", func(t *testing.T) {
		body := e2e.MustJSON(t, map[string]any{"command": []string{"bash", "-c", "head -c 200M /dev/zero > /workspace/big"}, "timeout_sec": 60})
		res := s.Exec(t, id, body, key)
		if res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left on device") {
			t.Fatalf("writing 200 MiB on a %d MiB disk: got exit %d, stderr %q, want a failure with ENOSPC", smallDiskMB, res.ExitCode, res.Stderr)
		}
		syscall.Sync()
		img := filepath.Join(box, "disk.img")
		got := hostBytes(t, img)
		t.Logf("host space of the full disk's image: %d bytes (disk_mb %d = %d bytes)", got, smallDiskMB, limit)
		if got > limit+diskSlackBytes || got < limit/2 {
			t.Errorf("du of %s after the fill: got %d bytes, want between %d and %d", img, got, limit/2, limit+diskSlackBytes)
		}
		// An upload past the disk is refused and leaves the disk as it was.
		r := s.Curl(t, http.MethodPut, e2e.Prefix+"/"+id+"/files?path=more.bin", make([]byte, 8<<20), key)
		r.WantError(t, http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", "disk is full")
		s.Run(t, id, []string{"rm", "/workspace/big"}, key)
		s.Run(t, id, []string{"bash", "-c", "echo kept > /workspace/kept.txt"}, key)
	})

	e2e.Step(t, "stop-keeps-the-disk-mounted-start-finds-it", func(t *testing.T) {
		r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/stop", nil, key)
		r.Want(t, http.StatusOK)
		// The disk stays mounted, its page cache with it (the driver's KeptMounts bound).
		if m, l := e2e.MountsUnder(box), e2e.LoopsBacking(box); len(m) != 1 || len(l) != 1 {
			t.Errorf("the stopped sandbox's disk: mounts %q, loop devices %q; want it kept mounted", m, l)
		}
		if _, err := os.Stat(filepath.Join(box, "disk.img")); err != nil {
			t.Fatalf("the stopped sandbox's disk image: %v", err)
		}
		r = s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/start", nil, key)
		r.Want(t, http.StatusOK)
		if out := s.Download(t, id, "kept.txt", key); out != "kept\n" {
			t.Errorf("after stop and start: got %q, want the file kept", out)
		}
		if m := e2e.MountsUnder(box); len(m) != 1 {
			t.Errorf("mounts of the started sandbox: got %q, want its disk", m)
		}
	})

	e2e.Step(t, "destroy-leaves-nothing", func(t *testing.T) {
		r := s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+id, nil, key)
		r.Want(t, http.StatusOK)
		wantNoDisk(t, box)
		if _, err := os.Stat(box); !os.IsNotExist(err) {
			t.Errorf("the destroyed sandbox's folder: got %v, want it gone", err)
		}
	})
}

// TestDiskSourceLargerThanDisk: creating a small-disk sandbox from a snapshot or an archive
// larger than its disk answers 400 INVALID_ARGUMENT saying so, and leaves nothing: no sandbox,
// no box folder, mount or loop device, the slot given back.
func TestDiskSourceLargerThanDisk(t *testing.T) {
	host, sources := e2e.ArchiveHost(t)
	s := diskServer(t, map[string]any{"sources": sources})
	key := e2e.HdrTenant1
	big := s.Create(t, `{"profile":"sandboxes-default"}`, key)
	s.Run(t, big.SandboxID, []string{"bash", "-c", "head -c 100M /dev/zero > /workspace/big.bin"}, key)
	r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+big.SandboxID+"/snapshots", nil, key)
	r.Want(t, http.StatusCreated)
	var snap snapshotJSON
	r.Decode(t, &snap)
	before := s.Quota(t, key)

	nothingLeft := func(t *testing.T) {
		t.Helper()
		l := s.List(t, key)
		if len(l.Sandboxes) != 1 || l.Sandboxes[0].SandboxID != big.SandboxID {
			t.Errorf("sandboxes after the refused create: got %+v, want only %s", l.Sandboxes, big.SandboxID)
		}
		if q := s.Quota(t, key); q.InUse != before.InUse {
			t.Errorf("slots after the refused create: got in_use %d, want %d as before", q.InUse, before.InUse)
		}
		entries, _ := os.ReadDir(filepath.Join(s.State.Dir, "boxes"))
		if len(entries) != 1 || entries[0].Name() != big.SandboxID {
			t.Errorf("box folders after the refused create: got %v, want only %s's", entries, big.SandboxID)
		}
		if l := e2e.LoopsBacking(s.State.Dir); len(l) != 1 {
			t.Errorf("loop devices after the refused create: got %q, want only the big sandbox's", l)
		}
	}

	e2e.Step(t, "snapshot", func(t *testing.T) {
		body := e2e.MustJSON(t, map[string]any{"profile": "small-disk", "source": map[string]any{"snapshot_id": snap.SnapshotID}})
		r := s.Curl(t, http.MethodPost, e2e.Prefix, []byte(body), e2e.HdrJSON, key)
		r.WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", snap.SnapshotID, "more than the sandbox's disk", fmt.Sprintf("disk_mb %d", smallDiskMB))
		nothingLeft(t)
	})

	e2e.Step(t, "archive", func(t *testing.T) {
		// A plain tar (no compression, so no bomb guard) of 100 MiB of content.
		url := host.Put("/big.tar", sourcetest.Tar(t, []sourcetest.Entry{sourcetest.File("big.bin", strings.Repeat("\x00", 100<<20))}))
		body := e2e.MustJSON(t, map[string]any{"profile": "small-disk", "source": map[string]any{"archive_url": url}})
		r := s.Curl(t, http.MethodPost, e2e.Prefix, []byte(body), e2e.HdrJSON, key)
		r.WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "source.archive_url", "disk", fmt.Sprintf("disk_mb %d", smallDiskMB))
		nothingLeft(t)
	})

	e2e.Step(t, "fits-a-larger-disk", func(t *testing.T) {
		body := e2e.MustJSON(t, map[string]any{"profile": "sandboxes-default", "source": map[string]any{"snapshot_id": snap.SnapshotID}})
		sb := s.Create(t, body, key)
		if out := s.Run(t, sb.SandboxID, []string{"stat", "-c", "%s", "big.bin"}, key); out != "104857600\n" {
			t.Errorf("the restored file: got size %q, want 104857600", out)
		}
	})
}
