package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/klauspost/compress/zstd"
	"go.opentelemetry.io/otel/trace"
)

// ctxReader fails its reads once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

type ctxReadCloser struct {
	ctxReader
	c io.Closer
}

func (c *ctxReadCloser) Close() error { return c.c.Close() }

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// verifier hashes and counts a checkpoint's compressed bytes and, at EOF, compares them
// with the manifest: a mismatch replaces io.EOF with an error wrapping ErrCorrupt.
type verifier struct {
	r    io.Reader
	m    Manifest
	h    hash.Hash
	n    int64
	eof  bool  // r reached EOF and the check passed
	bad  error // the ErrCorrupt error, once found
	ioEr error // an error of r itself (not corruption)
}

func newVerifier(r io.Reader, m Manifest) *verifier {
	return &verifier{r: r, m: m, h: sha256.New()}
}

func (v *verifier) Read(p []byte) (int, error) {
	if v.bad != nil {
		return 0, v.bad
	}
	n, err := v.r.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	switch {
	case v.n > v.m.Size:
		v.bad = corrupt(v.m, fmt.Sprintf("object longer than its manifest's %d bytes", v.m.Size))
		return n, v.bad
	case err == io.EOF:
		if v.n != v.m.Size {
			v.bad = corrupt(v.m, fmt.Sprintf("object has %d bytes, manifest says %d", v.n, v.m.Size))
		} else if sum := hex.EncodeToString(v.h.Sum(nil)); sum != v.m.SHA256 {
			v.bad = corrupt(v.m, fmt.Sprintf("object sha256 %s, manifest says %s", sum, v.m.SHA256))
		}
		if v.bad != nil {
			return n, v.bad
		}
		v.eof = true
	case err != nil:
		v.ioEr = err
	}
	return n, err
}

// finish reads what is left of the object (the decoder need not read to EOF) and reports
// whether it matched the manifest: nil or an error wrapping ErrCorrupt (or a read error).
func (v *verifier) finish() error {
	if v.eof {
		return nil
	}
	_, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{v}, make([]byte, 64<<10))
	if err != nil {
		return v.classify(err)
	}
	if v.bad != nil {
		return v.bad
	}
	return nil
}

// classify names the cause of a failed read of the stream: corruption found by the verifier,
// an error of the object reader, or else (the bytes are not a valid zstd stream) corruption.
func (v *verifier) classify(err error) error {
	switch {
	case v.bad != nil:
		return v.bad
	case v.ioEr != nil:
		return fmt.Errorf("read checkpoint %s: %w", v.m.ID, v.ioEr)
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("read checkpoint %s: %w", v.m.ID, err)
	default:
		return corrupt(v.m, fmt.Sprintf("decompress: %v", err))
	}
}

func corrupt(m Manifest, msg string) error {
	return fmt.Errorf("checkpoint %s (%s): %w: %s", m.ID, m.Object, ErrCorrupt, msg)
}

// snapshotReader is the decompressed tar stream that Open returns.
type snapshotReader struct {
	dec *zstd.Decoder
	v   *verifier
	obj io.Closer
	m   Manifest
	raw int64
	err error
	// span is the restore's span: it ends at the stream's end (with its error) or Close.
	span  trace.Span
	ended bool
}

// endSpan ends the restore's span once: with the manifest's sizes after a clean end, with
// the error that ended the stream, or (closed early) with the bytes read so far.
func (r *snapshotReader) endSpan(err error) {
	if r.ended || r.span == nil {
		return
	}
	r.ended = true
	m := r.m
	if err != nil || r.raw != m.RawSize {
		m = Manifest{}
		r.span.SetAttributes(keyRawBytes.Int64(r.raw))
	}
	endSpan(r.span, m, err)
}

func (r *snapshotReader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	n, err := r.dec.Read(p)
	r.raw += int64(n)
	switch {
	case r.raw > r.m.RawSize:
		err = corrupt(r.m, fmt.Sprintf("tar stream longer than its manifest's %d bytes", r.m.RawSize))
	case err == io.EOF:
		if err = r.v.finish(); err == nil {
			if r.raw != r.m.RawSize {
				err = corrupt(r.m, fmt.Sprintf("tar stream has %d bytes, manifest says %d", r.raw, r.m.RawSize))
			} else {
				err = io.EOF
			}
		}
	case err != nil:
		err = r.v.classify(err)
	}
	r.err = err
	if err == io.EOF {
		r.endSpan(nil)
	} else if err != nil {
		r.endSpan(err)
	}
	return n, err
}

func (r *snapshotReader) Close() error {
	r.endSpan(nil)
	r.dec.Close()
	if r.err == nil {
		r.err = errors.New("read of closed checkpoint")
	}
	return r.obj.Close()
}
