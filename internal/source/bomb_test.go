package source_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"sandboxd/internal/apierror"
	"sandboxd/internal/source"
)

// bomb is a compressed tar of files of 1 MiB of zeros (10 GiB in all by default), made as it
// is read and never held whole: concatenated gzip members (or zstd frames), one per tar
// header and one, compressed once and repeated, per file's content.
type bomb struct {
	compress func([]byte) []byte
	files    int
	fileSize int64 // declared in every header (1 MiB, or more for a header that lies big)
	zeros    []byte
	i        int
	buf      []byte
	sent     atomic.Int64
}

func newBomb(t *testing.T, format string, files int, fileSize int64) *bomb {
	b := &bomb{files: files, fileSize: fileSize}
	switch format {
	case "gzip":
		b.compress = func(p []byte) []byte {
			var out bytes.Buffer
			w, _ := gzip.NewWriterLevel(&out, gzip.BestCompression)
			w.Write(p)
			w.Close()
			return out.Bytes()
		}
	case "zstd":
		enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithEncoderLevel(zstd.SpeedBestCompression))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { enc.Close() })
		var mu sync.Mutex
		b.compress = func(p []byte) []byte {
			mu.Lock()
			defer mu.Unlock()
			return enc.EncodeAll(p, nil)
		}
	}
	b.zeros = b.compress(make([]byte, 1<<20))
	return b
}

func (b *bomb) Read(p []byte) (int, error) {
	for len(b.buf) == 0 {
		switch {
		case b.i > b.files:
			return 0, io.EOF
		case b.i == b.files:
			b.buf = b.compress(make([]byte, 1024)) // end of archive
		default:
			var h bytes.Buffer
			tw := tar.NewWriter(&h)
			if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("zeros/%06d", b.i), Typeflag: tar.TypeReg,
				Size: b.fileSize, Mode: 0o644, ModTime: mtime}); err != nil {
				return 0, err
			}
			b.buf = append(b.compress(h.Bytes()), b.zeros...)
		}
		b.i++
	}
	n := copy(p, b.buf)
	b.buf = b.buf[n:]
	b.sent.Add(int64(n))
	return n, nil
}

// A decompression bomb (10 GiB of zeros in about 10 MiB of gzip, or far less zstd) is stopped
// at MaxTotalBytes, quickly and with bounded memory.
func TestArchiveBomb(t *testing.T) {
	const limit = 16 << 20
	cases := []struct {
		name     string
		format   string
		fileSize int64
		want     []string
	}{
		{"Gzip10GiB", "gzip", 1 << 20, []string{`"zeros/000016"`, "limit of 16777216 bytes"}},
		{"Zstd10GiB", "zstd", 1 << 20, []string{`"zeros/000016"`, "limit of 16777216 bytes"}},
		// One header that says 10 GiB: refused at the header, before a byte is inflated.
		{"GzipOneHugeFile", "gzip", 10 << 30, []string{`"zeros/000000"`, "10737418240 bytes"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newServer(t)
			b := newBomb(t, c.format, 10240, c.fileSize)
			s.mux.HandleFunc("GET /bomb", func(w http.ResponseWriter, r *http.Request) {
				io.Copy(w, b) // ends when the client goes away
			})
			f := s.fetcher(t, source.Options{MaxTotalBytes: limit})

			runtime.GC()
			var base runtime.MemStats
			runtime.ReadMemStats(&base)
			var peak atomic.Uint64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for {
					var m runtime.MemStats
					runtime.ReadMemStats(&m)
					if m.HeapAlloc > peak.Load() {
						peak.Store(m.HeapAlloc)
					}
					select {
					case <-stop:
						return
					case <-tick.C:
					}
				}
			})
			start := time.Now()
			_, err := fetch(t, f, s.URL+"/bomb")
			elapsed := time.Since(start)
			close(stop)
			wg.Wait()

			wantErr(t, err, apierror.PayloadTooLarge, c.want...)
			if elapsed > time.Minute {
				t.Errorf("took %v to stop, want well under a minute", elapsed)
			}
			if grew := int64(peak.Load()) - int64(base.HeapAlloc); grew > 128<<20 {
				t.Errorf("heap grew by %d MiB, want under 128 MiB", grew>>20)
			}
			t.Logf("stopped after %v; heap peak +%d MiB; server produced %d KiB compressed",
				elapsed, (int64(peak.Load())-int64(base.HeapAlloc))>>20, b.sent.Load()>>10)
		})
	}
}
