// Package zframes compresses a stream as independent zstd frames of FrameBytes, several at
// once: what the checkpoint store writes (internal/checkpoint) and what the kube runtime's
// workspace reader sends (cmd/sandbox-init's export), so that the store can keep a reader's
// stream as it comes.
package zframes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/zstd"
)

// FrameBytes is how much of the stream one zstd frame holds. Frames are independent (each its
// own window), so a frame this size costs about 2% of the ratio of one long frame at level 1,
// and bounds a Compress's buffers to 4 per worker of about this size.
const FrameBytes = 1 << 20

// Compressor compresses a stream as a series of independent zstd frames, several at
// once: a zstd stream of concatenated frames is one valid stream to any decoder (Open's,
// `zstd -d`). klauspost's stream encoder cannot do it within a flat heap: its own parallel
// mode (WithConcurrentBlocks) held 50-350 MiB during one Save, its default mode compresses
// one block at a time. Here a Save's memory is its in-flight frames, at most 2 per worker,
// and its encoders, which are kept for the next Save.
type Compressor struct {
	workers  int
	opts     []zstd.EOption
	encoders sync.Pool // *zstd.Encoder, each used by one goroutine at a time (EncodeAll)
	buffers  sync.Pool // *frameJob with in of FrameBytes
}

type frameJob struct {
	in   []byte
	n    int
	out  []byte
	err  error // the encoder's, when the worker had none
	done chan struct{}
}

// New returns a Compressor of frames at level on up to workers goroutines.
func New(workers int, level zstd.EncoderLevel) *Compressor {
	return &Compressor{workers: workers, opts: []zstd.EOption{
		zstd.WithEncoderLevel(level),
		zstd.WithEncoderConcurrency(1),
		zstd.WithWindowSize(FrameBytes),
		// An empty stream is one empty frame, so that every object decodes.
		zstd.WithZeroFrames(true),
	}}
}

func (f *Compressor) encoder() (*zstd.Encoder, error) {
	if e, ok := f.encoders.Get().(*zstd.Encoder); ok {
		return e, nil
	}
	return zstd.NewWriter(nil, f.opts...)
}

func (f *Compressor) job() *frameJob {
	if j, ok := f.buffers.Get().(*frameJob); ok {
		return j
	}
	return &frameJob{in: make([]byte, FrameBytes), done: make(chan struct{}, 1)}
}

// Compress writes the compression of r to w and returns the bytes read from r. Frames are
// written in order; a failed write stops the reading at the next frame, and a failed read
// writes nothing after the frames before it (the caller fails the object: a stream cut at a
// frame boundary decodes as a shorter tar, so it must never be kept).
func (f *Compressor) Compress(ctx context.Context, w io.Writer, r io.Reader) (int64, error) {
	inflight := 2 * f.workers
	work := make(chan *frameJob)
	order := make(chan *frameJob, inflight)
	free := make(chan *frameJob, inflight)
	for range inflight {
		free <- f.job()
	}
	var workersWg sync.WaitGroup
	for range f.workers {
		workersWg.Add(1)
		go func() {
			defer workersWg.Done()
			enc, err := f.encoder()
			if err == nil {
				defer f.encoders.Put(enc)
			}
			for j := range work {
				j.err = nil
				if err != nil {
					j.err = fmt.Errorf("zstd: %w", err)
				} else {
					j.out = enc.EncodeAll(j.in[:j.n], j.out[:0])
				}
				j.done <- struct{}{}
			}
		}()
	}
	var failed atomic.Bool // a frame could not be written: read no further
	writeErr := make(chan error, 1)
	go func() {
		var err error
		for j := range order {
			<-j.done
			if err == nil {
				if err = j.err; err == nil {
					_, err = w.Write(j.out)
				}
				failed.Store(err != nil)
			}
			free <- j
		}
		writeErr <- err
	}()

	var total int64
	var readErr error
	cr := ctxReader{ctx: ctx, r: r}
	for first := true; ; first = false {
		j := <-free
		if failed.Load() {
			free <- j
			break
		}
		n, err := io.ReadFull(cr, j.in)
		total += int64(n)
		last := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
		if err != nil && !last {
			readErr = fmt.Errorf("read tar stream: %w", err)
			free <- j
			break
		}
		if n == 0 && !first {
			free <- j
			break
		}
		j.n = n
		order <- j
		work <- j
		if last {
			break
		}
	}
	close(work)
	workersWg.Wait()
	close(order)
	werr := <-writeErr
	for range inflight {
		j := <-free
		j.out = j.out[:0]
		f.buffers.Put(j)
	}
	if readErr != nil {
		return total, readErr
	}
	return total, werr
}

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
