package gvisor_test

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/runtime"
	"sandboxd/runtime/gvisor"
	"sandboxd/runtime/runtimetest"
)

// diskSlack is what the host may keep of a box's disk beyond its size: the host file system's
// own bookkeeping of the image file (its extent tree), a few KiB; 1 MiB is generous.
const diskSlack = 1 << 20

func boxDirOf(t *testing.T, d *gvisor.Driver, id string) string {
	return filepath.Join(stateDirOf(t, d), "boxes", id)
}

// allocated is the space a file takes on the host (st_blocks), what du reports.
func allocated(t testing.TB, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// loopsBacking lists the loop devices whose backing file lies under dir.
func loopsBacking(t testing.TB, dir string) []string {
	t.Helper()
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var found []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // detached meanwhile
		}
		if p := strings.TrimSpace(string(b)); strings.HasPrefix(p, dir+"/") {
			found = append(found, filepath.Base(filepath.Dir(filepath.Dir(f)))+"="+p)
		}
	}
	return found
}

// waitNoDisk waits until nothing of the box's disk is mounted and no loop device backs onto
// anything under dir (an autoclear loop device is released right after the unmount, but the
// release may trail it briefly).
func waitNoDisk(t testing.TB, dir string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m, l := mountsUnder(t, dir), loopsBacking(t, dir)
		if len(m) == 0 && len(l) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("got mounts %q and loop devices %q under %s, want none", m, l, dir)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func run(t testing.TB, c *client.Client, script string) client.RunResult {
	t.Helper()
	return runtimetest.MustRun(t, c, proto.ExecRequest{Argv: []string{"sh", "-c", script}})
}

// TestDiskEnforced: a box writing past its disk gets ENOSPC, the host keeps at most the disk's
// size, df inside shows the disk, and deleted files give their space back to the host.
func TestDiskEnforced(t *testing.T) {
	d := newDriver(t)
	spec := defaultSpec()
	const limit = 64 << 20
	spec.DiskBytes = limit
	id := runtimetest.CreateBox(t, d, spec)
	c := runtimetest.Client(t, d, id)
	img := filepath.Join(boxDirOf(t, d, id), "disk.img")

	res := run(t, c, "df -B1 --output=size,avail /workspace | tail -1")
	f := strings.Fields(string(res.Stdout))
	if res.Exit.ExitCode != 0 || len(f) != 2 {
		t.Fatalf("df: got exit %d, %q %q", res.Exit.ExitCode, res.Stdout, res.Stderr)
	}
	size, _ := strconv.ParseInt(f[0], 10, 64)
	t.Logf("df /workspace inside a box of a %d-byte disk: size %s, available %s", limit, f[0], f[1])
	// ext4's own metadata (journal, inode tables) is not part of what df counts.
	if size > limit || size < limit*8/10 {
		t.Errorf("df /workspace inside: got size %d, want at most the disk (%d) and at least 80%% of it", size, limit)
	}

	res = run(t, c, "head -c 200M /dev/zero > /workspace/big")
	if res.Exit.ExitCode == 0 || !strings.Contains(string(res.Stderr), "No space left on device") {
		t.Fatalf("writing 200 MiB on a 64 MiB disk: got exit %d, stderr %q, want a failure with ENOSPC", res.Exit.ExitCode, res.Stderr)
	}
	syscall.Sync()
	t.Logf("host space of the image after the fill: %d bytes (apparent size %d)", allocated(t, img), limit)
	if got := allocated(t, img); got > limit+diskSlack || got < limit/2 {
		t.Errorf("host space of the full disk image: got %d bytes, want between %d and %d", got, limit/2, limit+diskSlack)
	}
	res = run(t, c, "ls -A /workspace")
	if strings.TrimSpace(string(res.Stdout)) != "big" {
		t.Errorf("ls -A /workspace: got %q, want only big (no lost+found)", res.Stdout)
	}

	// Deleted files give their space back (discard: the loop device punches holes).
	run(t, c, "rm /workspace/big")
	deadline := time.Now().Add(20 * time.Second)
	for {
		syscall.Sync()
		got := allocated(t, img)
		if got < 16<<20 {
			t.Logf("host space of the image after rm: %d bytes", got)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("host space of the image after rm: got %d bytes, want under 16 MiB", got)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestDiskLifecycle, with no kept mounts: stop unmounts the disk and frees its loop device,
// start mounts it again on the same data, an export of a stopped box mounts it only for the
// read, delete leaves nothing.
func TestDiskLifecycle(t *testing.T) {
	d := newDriverWith(t, gvisor.Options{KeptMounts: -1})
	id := runtimetest.CreateBox(t, d, defaultSpec())
	box := boxDirOf(t, d, id)
	run(t, runtimetest.Client(t, d, id), "echo kept > /workspace/f")
	if m := mountsUnder(t, box); len(m) != 1 || m[0] != filepath.Join(box, "disk") {
		t.Fatalf("mounts of a running box: got %q, want its disk only", m)
	}
	if l := loopsBacking(t, box); len(l) != 1 {
		t.Fatalf("loop devices of a running box: got %q, want one", l)
	}

	if err := d.Stop(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	waitNoDisk(t, box)
	if _, err := os.Stat(filepath.Join(box, "disk.img")); err != nil {
		t.Fatalf("stop removed the disk image: %v", err)
	}

	// A stopped box's workspace is read by mounting its disk for the export only.
	rc, err := d.ExportWorkspace(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		names[h.Name] = string(b)
	}
	rc.Close()
	if len(names) != 1 || names["f"] != "kept\n" {
		t.Errorf("export of the stopped box: got %v, want only f = kept", names)
	}
	waitNoDisk(t, box)

	fresh, err := d.Start(ctxT(t), id)
	if err != nil || fresh {
		t.Fatalf("Start: got (%v, %v), want (false, nil)", fresh, err)
	}
	res := run(t, runtimetest.Client(t, d, id), "cat /workspace/f")
	if string(res.Stdout) != "kept\n" {
		t.Errorf("after stop and start: got %q, want the file kept", res.Stdout)
	}
	if m := mountsUnder(t, box); len(m) != 1 {
		t.Errorf("mounts after start: got %q, want one", m)
	}

	if err := d.Delete(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	waitNoDisk(t, box)
	if _, err := os.Stat(box); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("box folder after delete: got %v, want gone", err)
	}
}

// exportNames reads a box's workspace export: file name → content.
func exportNames(t *testing.T, d *gvisor.Driver, id string) map[string]string {
	t.Helper()
	rc, err := d.ExportWorkspace(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	names := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		names[h.Name] = string(b)
	}
}

// TestStopKeepsDiskMounted: by default a stop leaves the disk mounted (its page cache with
// it); an export of the stopped box reads it there, a start finds it, a delete unmounts it.
func TestStopKeepsDiskMounted(t *testing.T) {
	d := newDriver(t)
	id := runtimetest.CreateBox(t, d, defaultSpec())
	box := boxDirOf(t, d, id)
	run(t, runtimetest.Client(t, d, id), "echo kept > /workspace/f")
	if err := d.Stop(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	if m, l := mountsUnder(t, box), loopsBacking(t, box); len(m) != 1 || m[0] != filepath.Join(box, "disk") || len(l) != 1 {
		t.Fatalf("after stop: mounts %q, loop devices %q; want the disk's, kept", m, l)
	}
	if b, err := d.Get(ctxT(t), id); err != nil || b.Phase != runtime.PhaseStopped {
		t.Fatalf("Get of the stopped box: %+v, %v", b, err)
	}
	if names := exportNames(t, d, id); len(names) != 1 || names["f"] != "kept\n" {
		t.Errorf("export of the stopped box: got %v, want only f = kept", names)
	}
	if m := mountsUnder(t, box); len(m) != 1 {
		t.Errorf("mounts after the export: got %q, want the kept disk", m)
	}
	fresh, err := d.Start(ctxT(t), id)
	if err != nil || fresh {
		t.Fatalf("Start: got (%v, %v), want (false, nil)", fresh, err)
	}
	if res := run(t, runtimetest.Client(t, d, id), "cat /workspace/f; echo more >> /workspace/f"); string(res.Stdout) != "kept\n" {
		t.Errorf("after stop and start: got %q, want the file kept", res.Stdout)
	}
	if m := mountsUnder(t, box); len(m) != 1 {
		t.Errorf("mounts after start: got %q, want one", m)
	}
	if err := d.Stop(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	if names := exportNames(t, d, id); names["f"] != "kept\nmore\n" {
		t.Errorf("export after the second stop: got %v", names)
	}
	if err := d.Delete(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	waitNoDisk(t, box)
}

// waitMounted waits until exactly the boxes in want have their disk mounted.
func waitMounted(t *testing.T, d *gvisor.Driver, want map[string]bool, all ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var wrong []string
		for _, id := range all {
			if got := len(mountsUnder(t, boxDirOf(t, d, id))) > 0; got != want[id] {
				wrong = append(wrong, fmt.Sprintf("%s mounted=%v", id, got))
			}
		}
		if len(wrong) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kept disks: %v, want mounted exactly %v", wrong, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestKeptMountsBound: at most KeptMounts stopped boxes keep their disk mounted, the ones
// stopped last; an unmounted one starts as before; a new driver on the same folder (a server
// restart) finds the kept disks and holds its own bound.
func TestKeptMountsBound(t *testing.T) {
	d := newDriverWith(t, gvisor.Options{KeptMounts: 2})
	ids := make([]string, 3)
	for i := range ids {
		ids[i] = runtimetest.CreateBox(t, d, defaultSpec())
		run(t, runtimetest.Client(t, d, ids[i]), fmt.Sprintf("echo %d > /workspace/f", i))
	}
	a, b, c := ids[0], ids[1], ids[2]
	for _, id := range ids {
		if err := d.Stop(ctxT(t), id); err != nil {
			t.Fatal(err)
		}
	}
	waitMounted(t, d, map[string]bool{b: true, c: true}, ids...)
	waitNoDisk(t, boxDirOf(t, d, a)) // its loop device too

	// a was unmounted: its start mounts it again, on its data.
	if fresh, err := d.Start(ctxT(t), a); err != nil || fresh {
		t.Fatalf("Start of the unmounted box: got (%v, %v), want (false, nil)", fresh, err)
	}
	if res := run(t, runtimetest.Client(t, d, a), "cat /workspace/f"); string(res.Stdout) != "0\n" {
		t.Errorf("after its disk was unmounted: got %q", res.Stdout)
	}
	// A running box is never unmounted: b and c stay kept, a runs.
	waitMounted(t, d, map[string]bool{a: true, b: true, c: true}, ids...)
	if err := d.Stop(ctxT(t), a); err != nil {
		t.Fatal(err)
	}
	waitMounted(t, d, map[string]bool{c: true, a: true}, ids...)

	// A restart with a bound of 1: of c and a, one is unmounted.
	d2, err := gvisor.New(gvisor.Options{Runsc: components.runsc, StateDir: stateDirOf(t, d), InitBinary: components.init,
		Logger: testLogger(), KeptMounts: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d2.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := 0
		for _, id := range ids {
			n += len(mountsUnder(t, boxDirOf(t, d, id)))
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a restart with KeptMounts 1: %d disks mounted, want 1", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i, id := range ids {
		if fresh, err := d2.Start(ctxT(t), id); err != nil || fresh {
			t.Fatalf("Start %s: got (%v, %v), want (false, nil)", id, fresh, err)
		}
		if res := run(t, runtimetest.Client(t, d2, id), "cat /workspace/f"); string(res.Stdout) != fmt.Sprintf("%d\n", i) {
			t.Errorf("box %d after the restart: got %q", i, res.Stdout)
		}
		if err := d2.Delete(ctxT(t), id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDiskRestartAndReboot: a new driver (a server restart) reuses the mounts of running boxes;
// a disk found unmounted with its box dead (a host reboot) is mounted again on start.
func TestDiskRestartAndReboot(t *testing.T) {
	d := newDriver(t)
	id := runtimetest.CreateBox(t, d, defaultSpec())
	box := boxDirOf(t, d, id)
	run(t, runtimetest.Client(t, d, id), "echo kept > /workspace/f")

	d2, err := gvisor.New(gvisor.Options{Runsc: components.runsc, StateDir: stateDirOf(t, d), InitBinary: components.init, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d2.Close() })
	if fresh, err := d2.Start(ctxT(t), id); err != nil || fresh {
		t.Fatalf("Start of a running box by a new driver: got (%v, %v), want (false, nil)", fresh, err)
	}
	if res := run(t, runtimetest.Client(t, d2, id), "cat /workspace/f"); string(res.Stdout) != "kept\n" {
		t.Errorf("through the new driver: got %q", res.Stdout)
	}
	if m := mountsUnder(t, box); len(m) != 1 {
		t.Errorf("mounts after a driver restart: got %q, want one", m)
	}

	// A host reboot: the sandbox is gone and so is the mount.
	pid, err := d2.SandboxPid(ctxT(t), id)
	if err != nil || pid <= 0 {
		t.Fatalf("sandbox pid: %d %v", pid, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, d2, id, "failed", 10*time.Second)
	if err := syscall.Unmount(filepath.Join(box, "disk"), syscall.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	waitNoDisk(t, box)
	if fresh, err := d2.Start(ctxT(t), id); err != nil || fresh {
		t.Fatalf("Start after a reboot: got (%v, %v), want (false, nil)", fresh, err)
	}
	if res := run(t, runtimetest.Client(t, d2, id), "cat /workspace/f"); string(res.Stdout) != "kept\n" {
		t.Errorf("after a reboot: got %q, want the file kept", res.Stdout)
	}
	if err := d2.Delete(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	waitNoDisk(t, box)
}

// TestDiskLegacyWorkspace: a box made before disks (a plain workspace folder, no image) is
// exported from that folder, and starts fresh on a new disk with the old folder kept aside.
func TestDiskLegacyWorkspace(t *testing.T) {
	d := newDriver(t)
	id := runtimetest.CreateBox(t, d, defaultSpec())
	box := boxDirOf(t, d, id)
	if err := d.Stop(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(box, "disk.img")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(box, "workspace"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(box, "workspace", "old"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	rc, err := d.ExportWorkspace(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	h, err := tar.NewReader(rc).Next()
	rc.Close()
	if err != nil || h.Name != "old" {
		t.Errorf("export of a legacy workspace: got %v %v, want the entry old", h, err)
	}
	fresh, err := d.Start(ctxT(t), id)
	if err != nil || !fresh {
		t.Fatalf("Start of a legacy box: got (%v, %v), want (true, nil)", fresh, err)
	}
	if _, err := os.Stat(filepath.Join(box, "workspace.legacy", "old")); err != nil {
		t.Errorf("the legacy workspace was not kept aside: %v", err)
	}
	if res := run(t, runtimetest.Client(t, d, id), "ls -A /workspace"); len(res.Stdout) != 0 {
		t.Errorf("the new workspace: got %q, want empty", res.Stdout)
	}
	if err := d.Delete(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	waitNoDisk(t, box)
}

// TestDiskCreateFailures: a disk that cannot be made or mounted fails the create and leaves no
// box folder, mount or loop device.
func TestDiskCreateFailures(t *testing.T) {
	need(t)
	dir := t.TempDir()
	d, err := gvisor.New(gvisor.Options{Runsc: components.runsc, StateDir: dir, InitBinary: components.init,
		Logger: testLogger(), Mkfs: "/bin/true"}) // "formats" nothing: the mount fails
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	rec := runtimetest.NewRecord(defaultSpec())
	if err := d.Create(ctxT(t), rec); err == nil || !strings.Contains(err.Error(), "mount the disk") {
		t.Errorf("Create with an unformatted disk: got %v, want a mount error", err)
	}
	waitNoDisk(t, dir)

	small := defaultSpec()
	small.DiskBytes = 1 << 20
	if err := newDriver(t).Create(ctxT(t), runtimetest.NewRecord(small)); err == nil || !strings.Contains(err.Error(), "MiB") {
		t.Errorf("Create with a 1 MiB disk: got %v, want a refusal", err)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "boxes"))
	if len(entries) != 0 {
		t.Errorf("box folders left after failed creates: %v", entries)
	}
}

// TestNullNetNSNotStacked: parallel first creates pin runsc's null-netns once; it is unmounted
// when the last container goes, and by New and Close when a container vanished behind the
// driver's back.
func TestNullNetNSNotStacked(t *testing.T) {
	d := newDriver(t)
	dir := stateDirOf(t, d)
	netns := func() int {
		n := 0
		for _, m := range mountsUnder(t, dir) {
			if strings.HasSuffix(m, "/null-netns") {
				n++
			}
		}
		return n
	}
	var wg sync.WaitGroup
	ids := make([]string, 3)
	for i := range ids {
		wg.Go(func() { ids[i] = runtimetest.CreateBox(t, d, defaultSpec()) })
	}
	wg.Wait()
	if n := netns(); n > 1 {
		t.Errorf("null-netns mounts after 3 parallel creates: got %d, want at most 1", n)
	}
	for _, id := range ids {
		if err := d.Delete(ctxT(t), id); err != nil {
			t.Fatal(err)
		}
	}
	if n := netns(); n != 0 {
		t.Errorf("null-netns mounts with no container left: got %d, want 0", n)
	}

	// A container deleted behind the driver's back leaves the pin; New and Close remove it.
	for _, closeIt := range []bool{false, true} {
		id := runtimetest.CreateBox(t, d, defaultSpec())
		if out, err := exec.Command(components.runsc, "--root="+d.RootDir(), "delete", "-force", id).CombinedOutput(); err != nil {
			t.Fatalf("runsc delete: %v: %s", err, out)
		}
		if n := netns(); n != 1 {
			t.Fatalf("null-netns mounts: got %d, want 1", n)
		}
		d2, err := gvisor.New(gvisor.Options{Runsc: components.runsc, StateDir: dir, InitBinary: components.init, Logger: testLogger()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d2.Close() })
		if closeIt {
			if n := netns(); n != 0 {
				t.Fatalf("null-netns mounts after New: got %d, want 0", n)
			}
			// Pin it again with a create, then vanish the container again.
			id2 := runtimetest.CreateBox(t, d2, defaultSpec())
			if out, err := exec.Command(components.runsc, "--root="+d.RootDir(), "delete", "-force", id2).CombinedOutput(); err != nil {
				t.Fatalf("runsc delete: %v: %s", err, out)
			}
			if err := d2.Close(); err != nil {
				t.Fatal(err)
			}
			if err := d2.Delete(ctxT(t), id2); err != nil {
				t.Fatal(err)
			}
		}
		if n := netns(); n != 0 {
			t.Errorf("null-netns mounts after New/Close with no container: got %d, want 0", n)
		}
		if err := d.Delete(ctxT(t), id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDiskReleasedWhileOthersRun: a box's disk is released (unmounted, its loop device freed) by
// its stop even while other boxes, created after it, run: their sandboxes' mount namespaces do
// not keep copies of it.
func TestDiskReleasedWhileOthersRun(t *testing.T) {
	d := newDriverWith(t, gvisor.Options{KeptMounts: -1})
	a := runtimetest.CreateBox(t, d, defaultSpec())
	b := runtimetest.CreateBox(t, d, defaultSpec())
	if err := d.Stop(ctxT(t), a); err != nil {
		t.Fatal(err)
	}
	waitNoDisk(t, boxDirOf(t, d, a))
	if m := mountsUnder(t, boxDirOf(t, d, b)); len(m) != 1 {
		t.Errorf("mounts of the other box: got %q, want its disk", m)
	}
	for _, id := range []string{a, b} {
		if err := d.Delete(ctxT(t), id); err != nil {
			t.Fatal(err)
		}
	}
	waitNoDisk(t, stateDirOf(t, d))
}
