package gvisor_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sandboxd/guest/proto"
	"sandboxd/runtime/runtimetest"
)

// poolImages lists the formatted images of the driver's disk pool.
func poolImages(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "disk-pool", "*.img"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// TestDiskPool: a create leaves a formatted image of its size in the pool (made in the
// background), the next create of that size takes that very image, and its disk works.
func TestDiskPool(t *testing.T) {
	d := newDriver(t)
	dir := stateDirOf(t, d)
	spec := defaultSpec()
	spec.DiskBytes = 64 << 20
	runtimetest.CreateBox(t, d, spec)
	var pooled []string
	deadline := time.Now().Add(20 * time.Second)
	for pooled = poolImages(t, dir); len(pooled) != 1; pooled = poolImages(t, dir) {
		if time.Now().After(deadline) {
			t.Fatalf("got pool images %q 20 s after a create, want one", pooled)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.HasPrefix(filepath.Base(pooled[0]), "67108864.") {
		t.Errorf("pool image %s: want one of the created size, 67108864 bytes", pooled[0])
	}
	ino := inode(t, pooled[0])

	b := runtimetest.CreateBox(t, d, spec)
	if got := inode(t, filepath.Join(dir, "boxes", b, "disk.img")); got != ino {
		t.Errorf("the second box's disk is inode %d, want the pooled image's %d", got, ino)
	}
	res := runtimetest.MustRun(t, runtimetest.Client(t, d, b), proto.ExecRequest{Argv: []string{"sh", "-c",
		"echo hi > f && cat f && df -B1 --output=size /workspace | tail -1"}})
	lines := strings.Fields(string(res.Stdout))
	if len(lines) != 2 || lines[0] != "hi" {
		t.Fatalf("got %q (stderr %q), want the file and the disk size", res.Stdout, res.Stderr)
	}
	if size, err := strconv.ParseInt(lines[1], 10, 64); err != nil || size < 32<<20 || size > 64<<20 {
		t.Errorf("df shows %s bytes, want the 64 MiB disk less ext4's metadata", lines[1])
	}
	if ls, _ := os.ReadDir(filepath.Join(dir, "boxes", b, "disk", "workspace")); len(ls) != 1 {
		t.Errorf("the pooled disk's workspace holds %d entries, want only the new file", len(ls))
	}
	// Refilled in the background.
	deadline = time.Now().Add(20 * time.Second)
	for pooled = poolImages(t, dir); len(pooled) != 1 || inode(t, pooled[0]) == ino; pooled = poolImages(t, dir) {
		if time.Now().After(deadline) {
			t.Fatalf("got pool images %q, want a new one", pooled)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
