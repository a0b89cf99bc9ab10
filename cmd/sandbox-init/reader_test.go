package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"sandboxd/internal/exportend"
)

// TestExportAndIdle: `export DIR` writes DIR as a zstd tar of independent frames (links as
// links, a FIFO left out without blocking the walk) and exits 0 with the entry count on
// stderr; a folder that is not there exits 1 and says why; `idle` ends on SIGTERM.
func TestExportAndIdle(t *testing.T) {
	bin := buildInit(t)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("workspace "), 300_000) // 3 MB: several frames
	if err := os.WriteFile(filepath.Join(dir, "d", "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/shadow", filepath.Join(dir, "leak")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "export", dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("export: %v (%s)", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "3 entries") {
		t.Errorf("stderr %q, want the entry count (d, d/big, leak)", stderr.String())
	}
	// The end mark: stdout's size and SHA-256, by which a reader tells a stream cut on the way.
	sum := sha256.Sum256(stdout.Bytes())
	if n, got, ok := exportend.Parse(stderr.String()); !ok || n != int64(stdout.Len()) || !bytes.Equal(got, sum[:]) {
		t.Errorf("stderr %q: end mark %d %x %v, want %d %x", stderr.String(), n, got, ok, stdout.Len(), sum)
	}
	zr, err := zstd.NewReader(bytes.NewReader(stdout.Bytes()), zstd.WithDecoderMaxWindow(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	got := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[strings.TrimSuffix(h.Name, "/")] = h
		if h.Name == "d/big" {
			b, err := io.ReadAll(tr)
			if err != nil || !bytes.Equal(b, big) {
				t.Errorf("d/big: %d bytes (%v), want the file", len(b), err)
			}
		}
	}
	if h := got["leak"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "/etc/shadow" {
		t.Errorf("leak: %+v, want a link", h)
	}
	if _, ok := got["fifo"]; ok {
		t.Error("the FIFO is in the tar")
	}

	out, err := exec.Command(bin, "export", filepath.Join(dir, "nothing")).CombinedOutput()
	if code := exitCode(err); code != 1 || !strings.Contains(string(out), "nothing") {
		t.Errorf("export of a missing folder: exit %d, %q; want 1 naming it", code, out)
	}

	idle := exec.Command(bin, "idle")
	if err := idle.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := idle.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := waitExit(t, idle, 5*time.Second); err != nil {
		t.Errorf("idle after SIGTERM: %v, want exit 0", err)
	}
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
