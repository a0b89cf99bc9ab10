package checkpoint

import (
	"bytes"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"testing/iotest"
)

// framesInput is n bytes of a pattern that does not repeat within a chunk.
func framesInput(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

type closeCounter struct {
	io.Reader
	closed atomic.Int32
}

func (c *closeCounter) Close() error {
	c.closed.Add(1)
	return nil
}

func TestPrefetchGivesEveryByte(t *testing.T) {
	for _, n := range []int{0, 1, prefetchChunk - 1, prefetchChunk, 5*prefetchChunk + 7} {
		in := framesInput(n)
		// One byte per read underneath: the prefetcher fills its chunks from many reads.
		src := &closeCounter{Reader: iotest.OneByteReader(bytes.NewReader(in))}
		p := Prefetch(src)
		got, err := io.ReadAll(iotest.HalfReader(p))
		if err != nil || !bytes.Equal(got, in) {
			t.Fatalf("%d bytes: read %d, %v", n, len(got), err)
		}
		if err := p.Close(); err != nil || src.closed.Load() != 1 {
			t.Fatalf("%d bytes: Close = %v, underlying closed %d times", n, err, src.closed.Load())
		}
		p.Close()
		if src.closed.Load() != 1 {
			t.Fatalf("a second Close closed the underlying reader again")
		}
	}
}

// The underlying reader's error comes after the bytes read before it, as itself.
func TestPrefetchPassesTheError(t *testing.T) {
	bad := errors.New("checksum mismatch")
	in := framesInput(3*prefetchChunk + 100)
	p := Prefetch(&closeCounter{Reader: io.MultiReader(bytes.NewReader(in), iotest.ErrReader(bad))})
	defer p.Close()
	got, err := io.ReadAll(p)
	if !errors.Is(err, bad) || !bytes.Equal(got, in) {
		t.Fatalf("read %d of %d bytes, err %v; want all, then %v", len(got), len(in), err, bad)
	}
}

// endless is an endless reader that fails the test if Close comes during a Read.
type endless struct {
	t      *testing.T
	inRead atomic.Bool
	reads  atomic.Int64
	closed atomic.Bool
}

func (e *endless) Read(b []byte) (int, error) {
	e.inRead.Store(true)
	defer e.inRead.Store(false)
	if e.closed.Load() {
		e.t.Error("Read after Close")
	}
	e.reads.Add(1)
	return len(b), nil
}

func (e *endless) Close() error {
	if e.inRead.Load() {
		e.t.Error("Close during a Read")
	}
	e.closed.Store(true)
	return errors.New("closed")
}

// Close in the middle ends the goroutine, blocked with its chunks full, before it closes the
// underlying reader, and gives that Close's result.
func TestPrefetchCloseMidway(t *testing.T) {
	src := &endless{t: t}
	p := Prefetch(src)
	if _, err := io.ReadFull(p, make([]byte, 3*prefetchChunk/2)); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err == nil || err.Error() != "closed" {
		t.Fatalf("Close = %v, want the underlying Close's error", err)
	}
	reads := src.reads.Load()
	if _, err := p.Read(make([]byte, 10)); err == nil {
		// What was prefetched may still be given; then the reader ends.
		if _, err := io.Copy(io.Discard, p); err == nil {
			t.Fatal("reads after Close never ended")
		}
	}
	if src.reads.Load() != reads {
		t.Fatal("the underlying reader was read after Close")
	}
}
