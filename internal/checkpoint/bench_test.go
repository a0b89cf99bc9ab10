package checkpoint_test

import (
	"io"
	"os"
	"testing"

	"sandboxd/internal/checkpoint"
)

// The benchmarks use about 100 MB of generated workspace: ~60% source-like text, 30% random
// bytes, 10% zeros, in files of mixed sizes. MB/s is of the tar stream.

func benchSetup(b *testing.B, opts checkpoint.Options) (string, int64, *checkpoint.Store, checkpoint.Scope) {
	b.Helper()
	path, _, size, _ := tarFile(b, 42, 0, 100<<20, 4<<20)
	objs, err := checkpoint.NewLocalStore(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(size)
	b.ReportAllocs()
	return path, size, checkpoint.New(objs, opts), newScope()
}

func benchSave(b *testing.B, st *checkpoint.Store, sc checkpoint.Scope, path string) checkpoint.Manifest {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	m, err := st.Save(b.Context(), sc, f, "")
	if err != nil {
		b.Fatal(err)
	}
	return m
}

func benchOpen(b *testing.B, st *checkpoint.Store, sc checkpoint.Scope, id string) {
	rc, _, err := st.Open(b.Context(), sc, id)
	if err != nil {
		b.Fatal(err)
	}
	defer rc.Close()
	if _, err := io.Copy(io.Discard, rc); err != nil {
		b.Fatal(err)
	}
}

var benchModes = []struct {
	name string
	opts checkpoint.Options
}{
	{"Default", checkpoint.Options{}},
	{"Concurrency1", checkpoint.Options{EncoderConcurrency: 1}},
}

// BenchmarkSaveOpen saves a checkpoint and reads it back to EOF (verified).
func BenchmarkSaveOpen(b *testing.B) {
	for _, bm := range benchModes {
		b.Run(bm.name, func(b *testing.B) {
			path, size, st, sc := benchSetup(b, bm.opts)
			var m checkpoint.Manifest
			for b.Loop() {
				m = benchSave(b, st, sc, path)
				benchOpen(b, st, sc, m.ID)
				if err := st.Delete(b.Context(), sc, m.ID); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(m.Size)/float64(size), "ratio")
		})
	}
}

// BenchmarkSave saves a checkpoint (tar → zstd → sha256 → fsynced file + manifest).
func BenchmarkSave(b *testing.B) {
	for _, bm := range benchModes {
		b.Run(bm.name, func(b *testing.B) {
			path, _, st, sc := benchSetup(b, bm.opts)
			for b.Loop() {
				benchSave(b, st, sc, path)
			}
		})
	}
}

// BenchmarkOpen reads a checkpoint back to EOF (decompressed and verified).
func BenchmarkOpen(b *testing.B) {
	path, _, st, sc := benchSetup(b, checkpoint.Options{})
	m := benchSave(b, st, sc, path)
	for b.Loop() {
		benchOpen(b, st, sc, m.ID)
	}
}
