package zframes

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// framesInput is n bytes, half text-like and half random, so that frames differ in size and
// finish out of order.
func framesInput(n int) []byte {
	r := rand.New(rand.NewPCG(uint64(n), 7))
	b := make([]byte, n)
	for i := 0; i < n; i += 64 << 10 {
		chunk := b[i:min(i+64<<10, n)]
		if (i/(64<<10))%2 == 0 {
			for k := range chunk {
				chunk[k] = "sandbox workspace\n"[k%18]
			}
		} else {
			for k := range chunk {
				chunk[k] = byte(r.Uint32())
			}
		}
	}
	return b
}

func decodeAll(t *testing.T, b []byte) []byte {
	t.Helper()
	dec, err := zstd.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	out, err := io.ReadAll(dec)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	return out
}

// countFrames counts the zstd frames of b, walking each frame's header and block headers.
func countFrames(t *testing.T, b []byte) int {
	t.Helper()
	n := 0
	for len(b) > 0 {
		var h zstd.Header
		if err := h.Decode(b); err != nil {
			t.Fatalf("frame %d: %v", n, err)
		}
		b = b[h.HeaderSize:]
		for {
			// A block header: 3 bytes little endian, bit 0 the last block, bits 1-2 its
			// type (1: RLE, one byte of content), the rest its size.
			hdr := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16
			last, size := hdr&1 == 1, int(hdr>>3)
			if (hdr>>1)&3 == 1 {
				size = 1
			}
			b = b[3+size:]
			if last {
				break
			}
		}
		if h.HasCheckSum {
			b = b[4:]
		}
		n++
	}
	return n
}

func TestFramesRoundTrip(t *testing.T) {
	for _, workers := range []int{2, 3} {
		for _, n := range []int{0, 1, FrameBytes - 1, FrameBytes, FrameBytes + 1, 5*FrameBytes + 12345} {
			in := framesInput(n)
			f := New(workers, zstd.SpeedFastest)
			var out bytes.Buffer
			got, err := f.Compress(t.Context(), &out, bytes.NewReader(in))
			if err != nil || got != int64(n) {
				t.Fatalf("workers %d, %d bytes: compress = %d, %v", workers, n, got, err)
			}
			if dec := decodeAll(t, out.Bytes()); !bytes.Equal(dec, in) {
				t.Fatalf("workers %d, %d bytes: decoded %d bytes, not the input", workers, n, len(dec))
			}
			if want := max(1, (n+FrameBytes-1)/FrameBytes); countFrames(t, out.Bytes()) != want {
				t.Fatalf("workers %d, %d bytes: want %d frames", workers, n, want)
			}
		}
	}
}

// A compressor used again reuses its encoders and buffers: nothing of the last stream shows
// in the next.
func TestFramesReuse(t *testing.T) {
	f := New(2, zstd.SpeedFastest)
	for i, n := range []int{3*FrameBytes + 7, 10, 2 * FrameBytes, 0} {
		in := framesInput(n + i)
		var out bytes.Buffer
		if _, err := f.Compress(t.Context(), &out, bytes.NewReader(in)); err != nil {
			t.Fatal(err)
		}
		if dec := decodeAll(t, out.Bytes()); !bytes.Equal(dec, in) {
			t.Fatalf("stream %d: decoded %d bytes, want %d", i, len(dec), len(in))
		}
	}
}

type failingWriter struct {
	writes, failAt int
}

func (w *failingWriter) Write(p []byte) (int, error) {
	w.writes++
	if w.writes >= w.failAt {
		return 0, errors.New("store went away")
	}
	return len(p), nil
}

// countReader counts the bytes read from an endless stream.
type countReader struct{ n int64 }

func (c *countReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(c.n + int64(i))
	}
	c.n += int64(len(p))
	return len(p), nil
}

// A failed write stops the reading within the frames in flight: an endless stream ends.
func TestFramesWriteFailureStopsReading(t *testing.T) {
	f := New(2, zstd.SpeedFastest)
	src := &countReader{}
	_, err := f.Compress(t.Context(), &failingWriter{failAt: 3}, src)
	if err == nil || err.Error() != "store went away" {
		t.Fatalf("compress = %v, want the write's error", err)
	}
	// Two frames written, the third failed; at most 2 per worker were in flight, and the
	// reader may have taken one more buffer before it saw the failure.
	if max := int64(3+2*2+1) * FrameBytes; src.n > max {
		t.Fatalf("read %d bytes after the write failed, want at most %d", src.n, max)
	}
}

type brokenReader struct {
	left int
}

func (b *brokenReader) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, errors.New("disk gone")
	}
	n := min(len(p), b.left)
	b.left -= n
	return n, nil
}

// A read that fails is the compressor's error, and a canceled context is too.
func TestFramesReadFailure(t *testing.T) {
	f := New(2, zstd.SpeedFastest)
	_, err := f.Compress(t.Context(), io.Discard, &brokenReader{left: 2*FrameBytes + 100})
	if err == nil || err.Error() != "read tar stream: disk gone" {
		t.Fatalf("compress = %v, want the read's error", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := f.Compress(ctx, io.Discard, &countReader{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("compress with a canceled context = %v", err)
	}
}
