package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/zstd"
)

// frameBytes is how much of the tar stream one zstd frame holds when a Save compresses on
// several cores (frameCompressor). Frames are independent (each its own window), so a frame
// this size costs about 2% of the ratio of one long frame at level 1, and bounds a Save's
// buffers to 4 per worker of about this size.
const frameBytes = 1 << 20

// frameCompressor compresses a stream as a series of independent zstd frames, several at
// once: a zstd stream of concatenated frames is one valid stream to any decoder (Open's,
// `zstd -d`). klauspost's stream encoder cannot do it within a flat heap: its own parallel
// mode (WithConcurrentBlocks) held 50-350 MiB during one Save, its default mode compresses
// one block at a time. Here a Save's memory is its in-flight frames, at most 2 per worker,
// and its encoders, which are kept for the next Save.
type frameCompressor struct {
	workers  int
	opts     []zstd.EOption
	encoders sync.Pool // *zstd.Encoder, each used by one goroutine at a time (EncodeAll)
	buffers  sync.Pool // *frameJob with in of frameBytes
}

type frameJob struct {
	in   []byte
	n    int
	out  []byte
	err  error // the encoder's, when the worker had none
	done chan struct{}
}

func newFrameCompressor(workers int, level zstd.EncoderLevel) *frameCompressor {
	return &frameCompressor{workers: workers, opts: []zstd.EOption{
		zstd.WithEncoderLevel(level),
		zstd.WithEncoderConcurrency(1),
		zstd.WithWindowSize(frameBytes),
		// An empty stream is one empty frame, so that every object decodes.
		zstd.WithZeroFrames(true),
	}}
}

func (f *frameCompressor) encoder() (*zstd.Encoder, error) {
	if e, ok := f.encoders.Get().(*zstd.Encoder); ok {
		return e, nil
	}
	return zstd.NewWriter(nil, f.opts...)
}

func (f *frameCompressor) job() *frameJob {
	if j, ok := f.buffers.Get().(*frameJob); ok {
		return j
	}
	return &frameJob{in: make([]byte, frameBytes), done: make(chan struct{}, 1)}
}

// compress writes the compression of r to w and returns the bytes read from r. Frames are
// written in order; a failed write stops the reading at the next frame, and a failed read
// writes nothing after the frames before it (the caller fails the object: a stream cut at a
// frame boundary decodes as a shorter tar, so it must never be kept).
func (f *frameCompressor) compress(ctx context.Context, w io.Writer, r io.Reader) (int64, error) {
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
