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
// byte, a cut file, a file more or a missing sums file is refused, saying which; sums an
// earlier sandboxd wrote (sha256) are still checked.
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
	if _, ok, why := checkKept(dir); ok || why != "no sums" {
		t.Errorf("without sums: ok=%v %q, want refused: no sums", ok, why)
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
