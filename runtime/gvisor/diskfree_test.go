package gvisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A mount waits while an earlier attachment of the same image lives on (a lazily detached
// mount holds its loop device until its last user closes), and goes ahead once it is gone.
func TestWaitImageFree(t *testing.T) {
	if _, err := os.Stat("/dev/loop-control"); err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and loop devices")
	}
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := waitImageFree(img, time.Second); err != nil {
		t.Fatalf("an image nothing holds: %v", err)
	}
	dev, lf, err := attachLoop(img)
	if err != nil {
		t.Fatal(err)
	}
	err = waitImageFree(img, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), dev) {
		t.Errorf("an image attached to %s: got %v, want an error naming the device", dev, err)
	}
	other := filepath.Join(t.TempDir(), "other.img")
	if err := os.WriteFile(other, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := waitImageFree(other, time.Second); err != nil {
		t.Errorf("another image: %v", err)
	}
	// The device clears itself on its last close (LO_FLAGS_AUTOCLEAR), a moment later.
	go func() { time.Sleep(100 * time.Millisecond); lf.Close() }()
	if err := waitImageFree(img, 10*time.Second); err != nil {
		t.Errorf("after the device was released: %v", err)
	}
}
