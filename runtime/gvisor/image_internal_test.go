package gvisor

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckKept: a kept image matches the sums MemoryImage's stream took (CRC-32C); a flipped
// byte, a cut file or a file more is refused, saying which; sums an earlier sandboxd wrote
// (sha256) are still checked. An image not streamed yet (no sums) is runsc's files as they
// are, refused only with a file runsc does not write or an unreadable meta.json.
func TestCheckKept(t *testing.T) {
	mk := func(t *testing.T) (string, []string) {
		dir := t.TempDir()
		files := map[string][]byte{imageMetaFile: []byte(`{"format":1,"box":"sbx_x"}`), "checkpoint.img": make([]byte, 100000), "pages.img": make([]byte, 3<<20)}
		var names []string
		for n, b := range files {
			if n != imageMetaFile {
				_, _ = rand.Read(b[len(b)/2:])
			}
			if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
				t.Fatal(err)
			}
			names = append(names, n)
		}
		return dir, names
	}
	stream := func(t *testing.T, dir string, names []string) imageSums {
		var fs []*os.File
		for _, n := range names {
			f, err := os.Open(filepath.Join(dir, n))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			fs = append(fs, f)
		}
		sums, err := writeImageTar(io.Discard, names, fs)
		if err != nil {
			t.Fatal(err)
		}
		if err := writeJSONAtomic(filepath.Join(dir, imageSumsFile), sums); err != nil {
			t.Fatal(err)
		}
		return sums
	}
	dir, names := mk(t)
	// Not streamed yet (a pause's store follows its answer): runsc's files as they are.
	if meta, ok, why := checkKept(dir); !ok || why != "no sums" || meta.Box != "sbx_x" {
		t.Errorf("without sums: ok=%v %q (meta %+v), want accepted: no sums", ok, why, meta)
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok, why := checkKept(dir); ok || !strings.Contains(why, "unexpected file notes.txt") {
		t.Errorf("without sums, a file runsc does not write: ok=%v %q, want refused", ok, why)
	}
	if err := os.Remove(filepath.Join(dir, "notes.txt")); err != nil {
		t.Fatal(err)
	}
	meta := filepath.Join(dir, imageMetaFile)
	mb, _ := os.ReadFile(meta)
	if err := os.WriteFile(meta, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok, why := checkKept(dir); ok || why != "unreadable meta.json" {
		t.Errorf("without sums, a broken meta.json: ok=%v %q, want refused", ok, why)
	}
	if err := os.WriteFile(meta, mb, 0o600); err != nil {
		t.Fatal(err)
	}
	sums := stream(t, dir, names)
	for n, e := range sums {
		if len(e.CRC32C) != 8 || e.SHA256 != "" {
			t.Errorf("sum of %s: %+v, want a CRC-32C only", n, e)
		}
	}
	if meta, ok, why := checkKept(dir); !ok || meta.Box != "sbx_x" {
		t.Fatalf("intact image: ok=%v %q (meta %+v)", ok, why, meta)
	}

	pages := filepath.Join(dir, "pages.img")
	b, _ := os.ReadFile(pages)
	b[len(b)-7] ^= 0x40
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(pages, b, 0o600))
	if _, ok, why := checkKept(dir); ok || !strings.Contains(why, "pages.img does not match") {
		t.Errorf("a flipped bit: ok=%v %q, want pages.img refused", ok, why)
	}
	b[len(b)-7] ^= 0x40
	must(os.WriteFile(pages, b[:len(b)-4096], 0o600))
	if _, ok, why := checkKept(dir); ok || !strings.Contains(why, "does not match") {
		t.Errorf("a cut file: ok=%v %q", ok, why)
	}
	must(os.WriteFile(pages, b, 0o600))
	must(os.WriteFile(filepath.Join(dir, "extra.img"), []byte("x"), 0o600))
	if _, ok, why := checkKept(dir); ok || !strings.Contains(why, "unexpected file extra.img") {
		t.Errorf("a file more: ok=%v %q", ok, why)
	}
	must(os.Remove(filepath.Join(dir, "extra.img")))

	// Sums an earlier build wrote when a store was retried: they named sums.json itself, with
	// the sum of the file they then replaced. The image's own files decide.
	withSelf := imageSums{}
	for n, e := range sums {
		withSelf[n] = e
	}
	self := withSelf[imageMetaFile]
	self.Size, self.CRC32C = 3, "00000000"
	withSelf[imageSumsFile] = self
	must(writeJSONAtomic(filepath.Join(dir, imageSumsFile), withSelf))
	if _, ok, why := checkKept(dir); !ok {
		t.Errorf("sums naming sums.json: refused (%s), want the intact image accepted", why)
	}

	// Sums of an earlier sandboxd: sha256.
	old := imageSums{}
	for _, n := range names {
		data, _ := os.ReadFile(filepath.Join(dir, n))
		h := sha256.Sum256(data)
		e := old[n]
		e.Size, e.SHA256 = int64(len(data)), hex.EncodeToString(h[:])
		old[n] = e
	}
	must(writeJSONAtomic(filepath.Join(dir, imageSumsFile), old))
	if _, ok, why := checkKept(dir); !ok {
		t.Errorf("sha256 sums of an intact image: refused (%s)", why)
	}
	b[10] ^= 1
	must(os.WriteFile(pages, b, 0o600))
	if _, ok, _ := checkKept(dir); ok {
		t.Errorf("sha256 sums of a changed image: accepted")
	}
}

// TestWriteSumsOnlyBesideTheImageRead: a store that read one image writes its sums beside that
// image only: not into the folder of the next pause's image (resumed and paused again while
// it read; the folder may even get the same inode), nor into a dropped one.
func TestWriteSumsOnlyBesideTheImageRead(t *testing.T) {
	var d Driver
	dir := filepath.Join(t.TempDir(), memoryDn)
	mkImage := func(at string) []byte {
		t.Helper()
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		meta := []byte(`{"format":1,"box":"sbx_x","created_at":"` + at + `"}`)
		if err := os.WriteFile(filepath.Join(dir, imageMetaFile), meta, 0o600); err != nil {
			t.Fatal(err)
		}
		return meta
	}
	made := mkImage("2026-12-02T21:00:00.000000001Z")
	sums := imageSums{"pages.img": {Size: 1, CRC32C: "00000000"}}
	if err := d.writeSums("sbx_x", dir, made, sums); err != nil {
		t.Fatalf("sums beside the image read: %v", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := d.writeSums("sbx_x", dir, made, sums); err == nil {
		t.Error("sums of a dropped image: written")
	}
	mkImage("2026-12-02T21:00:00.000000002Z") // the next pause's
	if err := d.writeSums("sbx_x", dir, made, sums); err == nil {
		t.Error("sums of one image written beside the next")
	}
	if _, err := os.Stat(filepath.Join(dir, imageSumsFile)); err == nil {
		t.Error("the next image's folder holds the earlier image's sums")
	}
}
