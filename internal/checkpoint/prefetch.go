package checkpoint

import (
	"io"
	"sync"
)

const (
	prefetchChunk = 256 << 10
	prefetchDepth = 4
)

// Prefetch returns a reader of rc's bytes that reads rc on its own goroutine, up to 1 MiB
// ahead of the caller: a checkpoint's reading, hashing and decompression (Open's reader does
// them inside Read, on one core) then overlap what the caller does with the bytes, such as
// writing the files of a workspace being restored. Close stops that goroutine, after the Read
// it may be in, before it closes rc; rc's Read and Close are never called at once.
func Prefetch(rc io.ReadCloser) io.ReadCloser {
	p := &prefetcher{rc: rc, full: make(chan []byte, prefetchDepth), free: make(chan []byte, prefetchDepth),
		stop: make(chan struct{})}
	for range prefetchDepth {
		p.free <- make([]byte, prefetchChunk)
	}
	p.wg.Add(1)
	go p.run()
	return p
}

type prefetcher struct {
	rc   io.ReadCloser
	full chan []byte // chunks read, in order; closed after the last, with err set
	free chan []byte
	stop chan struct{}
	wg   sync.WaitGroup
	err  error // rc's error (io.EOF at its end): read only once full is closed

	cur      []byte // what is left of the chunk being given out
	curChunk []byte // that chunk whole, for free
	once     sync.Once
	closeErr error
}

func (p *prefetcher) run() {
	defer p.wg.Done()
	defer close(p.full)
	for {
		var buf []byte
		select {
		case buf = <-p.free:
		case <-p.stop:
			p.err = io.ErrClosedPipe
			return
		}
		n, err := io.ReadFull(p.rc, buf[:cap(buf)])
		if n > 0 {
			select {
			case p.full <- buf[:n]:
			case <-p.stop:
				p.err = io.ErrClosedPipe
				return
			}
		}
		if err == io.ErrUnexpectedEOF {
			err = io.EOF
		}
		if err != nil {
			p.err = err
			return
		}
	}
}

func (p *prefetcher) Read(b []byte) (int, error) {
	if len(p.cur) == 0 {
		if p.curChunk != nil {
			p.free <- p.curChunk
			p.curChunk = nil
		}
		chunk, ok := <-p.full
		if !ok {
			return 0, p.err
		}
		p.cur, p.curChunk = chunk, chunk
	}
	n := copy(b, p.cur)
	p.cur = p.cur[n:]
	return n, nil
}

func (p *prefetcher) Close() error {
	p.once.Do(func() {
		close(p.stop)
		p.wg.Wait()
		p.closeErr = p.rc.Close()
	})
	return p.closeErr
}
