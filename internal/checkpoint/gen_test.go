package checkpoint_test

import (
	"archive/tar"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"sandboxd/internal/checkpoint"
)

// genFile is one file of a generated workspace.
type genFile struct {
	name     string
	typ      byte
	size     int64
	linkname string
	sum      [32]byte
}

var words = []string{"func", "return", "package", "import", "the", "sandbox", "workspace", "if", "err",
	"nil", "{", "}", "(", ")", "\n", "\t", "checkpoint", "for", "range", "string", "int64", ":=", "=", ".",
	"context", "ctx", "error", "fmt", "Errorf", "// a comment about", "const", "var", "type", "struct"}

// fill writes n bytes of the given kind: text (compressible, source-like), random
// (incompressible) or zeros.
func fill(w io.Writer, rng *rand.Rand, kind int, n int64) error {
	buf := make([]byte, 32<<10)
	var seed [32]byte
	for i := range seed {
		seed[i] = byte(rng.Uint32())
	}
	random := rand.NewChaCha8(seed)
	for n > 0 {
		b := buf[:min(int64(len(buf)), n)]
		switch kind {
		case 0:
			for i := 0; i < len(b); {
				i += copy(b[i:], words[rng.IntN(len(words))])
				if i < len(b) {
					b[i] = ' '
					i++
				}
			}
		case 1:
			random.Read(b)
		default:
			clear(b)
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
		n -= int64(len(b))
	}
	return nil
}

// writeTar writes a generated workspace as a tar stream and returns its entries: at least
// files files and total bytes, of mixed sizes up to maxSize, a folder per 50 files, and a
// symlink.
func writeTar(w io.Writer, seed uint64, files int, total, maxSize int64) ([]genFile, error) {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	tw := tar.NewWriter(w)
	mtime := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	var out []genFile
	var written int64
	for i := 0; i < files || written < total; i++ {
		if i%50 == 0 {
			dir := fmt.Sprintf("dir%03d/", i/50)
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: mtime}); err != nil {
				return nil, err
			}
			out = append(out, genFile{name: dir, typ: tar.TypeDir})
		}
		var size int64
		switch r := rng.IntN(100); {
		case r < 10:
			size = 0
		case r < 70:
			size = rng.Int64N(4 << 10)
		case r < 95:
			size = rng.Int64N(256 << 10)
		default:
			size = rng.Int64N(4 << 20)
		}
		size = min(size, maxSize)
		if total > 0 {
			size = min(size, max(total-written, 0))
			if i >= files && size == 0 {
				size = min(1<<20, maxSize)
			}
		}
		kind := rng.IntN(10) // 60% text, 30% random, 10% zeros
		switch {
		case kind < 6:
			kind = 0
		case kind < 9:
			kind = 1
		default:
			kind = 2
		}
		f := genFile{name: fmt.Sprintf("dir%03d/file%05d.dat", i/50, i), typ: tar.TypeReg, size: size}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: size, ModTime: mtime}); err != nil {
			return nil, err
		}
		h := sha256.New()
		if err := fill(io.MultiWriter(tw, h), rng, kind, size); err != nil {
			return nil, err
		}
		h.Sum(f.sum[:0])
		out = append(out, f)
		written += size
	}
	link := genFile{name: "dir000/link", typ: tar.TypeSymlink, linkname: "file00000.dat"}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: link.name, Linkname: link.linkname, Mode: 0o777, ModTime: mtime}); err != nil {
		return nil, err
	}
	out = append(out, link)
	return out, tw.Close()
}

// tarFile writes a generated tar to a file in t's temp dir and returns its path, entries,
// size and sha256.
func tarFile(tb testing.TB, seed uint64, files int, total, maxSize int64) (string, []genFile, int64, [32]byte) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "ws.tar")
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	cw := &counter{}
	entries, err := writeTar(io.MultiWriter(f, h, cw), seed, files, total, maxSize)
	if err != nil {
		tb.Fatal(err)
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return path, entries, cw.n, sum
}

type counter struct{ n int64 }

func (c *counter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// checkTar reads a tar stream and compares it with the generated entries, then drains r to
// EOF (as a restore must) and returns the first error.
func checkTar(r io.Reader, want []genFile) error {
	tr := tar.NewReader(r)
	for i := 0; ; i++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			if i != len(want) {
				return fmt.Errorf("got %d entries, want %d", i, len(want))
			}
			break
		}
		if err != nil {
			return err
		}
		if i >= len(want) {
			return fmt.Errorf("got more than %d entries", len(want))
		}
		w := want[i]
		if hdr.Name != w.name || hdr.Typeflag != w.typ || hdr.Linkname != w.linkname {
			return fmt.Errorf("entry %d = %q type %c link %q, want %q type %c link %q",
				i, hdr.Name, hdr.Typeflag, hdr.Linkname, w.name, w.typ, w.linkname)
		}
		if w.typ == tar.TypeReg {
			h := sha256.New()
			n, err := io.Copy(h, tr)
			if err != nil {
				return err
			}
			if n != w.size || [32]byte(h.Sum(nil)) != w.sum {
				return fmt.Errorf("entry %s: %d bytes with another content, want %d", w.name, n, w.size)
			}
		}
	}
	_, err := io.Copy(io.Discard, r)
	return err
}

func newScope() checkpoint.Scope {
	return checkpoint.Scope{Tenant: "acme", Project: "web", Sandbox: "sbx_" + ulid.Make().String()}
}
