package server

import (
	"errors"
	"io"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/guest/proto"
)

// A command's stdin, when it has any, is fed by a stdinFeed: a buffer of the bytes the command
// has not been given yet and one goroutine (run) that writes them, in the order the calls
// were taken, into the stdin pipe's write end or the terminal's master, both raw non-blocking
// descriptors. A write call never waits for the command: it takes all of its bytes into the
// buffer or none (proto.StdinBufferBytes), so a command that never reads fills the buffer,
// later calls answer ErrCodeUnavailable at once, and nothing else waits on it. The feed stops
// when the command ends (the bytes left are dropped), when the command closed its end (EPIPE:
// later calls answer ErrCodeState), or, when asked, once the buffer drained: it then closes a
// pipe (the command reads EOF) or types the terminal's end-of-file character (see
// terminal.eofBytes).
type stdinFeed struct {
	fd     int       // the pipe's write end, or the terminal's master
	ownsFD bool      // a pipe's write end: the feed closes it when it stops
	term   *terminal // the terminal for a Tty exec, nil for a pipe
	// open: the exec was started with StdinOpen or Tty, so write calls are taken.
	open bool

	mu  sync.Mutex
	buf []byte // not yet written into fd, oldest first
	// closing: a call asked to close stdin after the buffer (no more bytes are taken);
	// closed: the feed took its last byte (closed, the command's end is gone, or it ended).
	closing, closed bool
	// lineOpen: the last byte typed into a terminal left a line open (see terminal.eofBytes).
	lineOpen bool

	wake     chan struct{} // a write call added bytes or asked to close (buffered: 1)
	stop     chan struct{} // closed by shutdown
	stopOnce sync.Once
	done     chan struct{} // closed when run returned
}

// stdinChunk is the most one write(2) of the feed passes on.
const stdinChunk = 64 << 10

// stdinStall is the longest the feed waits on a descriptor that takes nothing before it looks
// at its stop channel again.
const stdinStall = 50 * time.Millisecond

// newStdinFeed feeds fd, starting with initial (which may exceed the buffer's bound: it is the
// request's own); closeAfter closes stdin after it and takes no write calls.
func newStdinFeed(fd int, ownsFD bool, term *terminal, initial []byte, closeAfter bool) *stdinFeed {
	f := &stdinFeed{
		fd:      fd,
		ownsFD:  ownsFD,
		term:    term,
		open:    !closeAfter,
		buf:     initial,
		closing: closeAfter,
		wake:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	f.noteTyped(initial)
	return f
}

// inputPipe makes a stdin pipe: the read end a blocking *os.File for the child, the write end
// a raw non-blocking descriptor for the feed.
func inputPipe() (r *os.File, w int, err error) {
	var fds [2]int
	if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC); err != nil {
		return nil, -1, err
	}
	if err := syscall.SetNonblock(fds[1], true); err != nil {
		_ = syscall.Close(fds[0])
		_ = syscall.Close(fds[1])
		return nil, -1, err
	}
	return os.NewFile(uintptr(fds[0]), "|stdin"), fds[1], nil
}

// writable reports whether write calls are taken (ExecInfo.StdinOpen).
func (f *stdinFeed) writable() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.open && !f.closing && !f.closed
}

// refusal is why write calls are not taken, or nil.
func (f *stdinFeed) refusal(id string) *proto.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refusalLocked(id)
}

func (f *stdinFeed) refusalLocked(id string) *proto.Error {
	switch {
	case !f.open:
		return errorf(proto.ErrCodeState, "exec %s was started without open stdin", id)
	case f.closed || f.closing:
		return errorf(proto.ErrCodeState, "the stdin of exec %s is closed", id)
	}
	return nil
}

// write takes all of data into the buffer or none of it, and with closeAfter closes stdin once
// the buffer drained.
func (f *stdinFeed) write(id string, data []byte, closeAfter bool) (proto.StdinResult, *proto.Error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.refusalLocked(id); err != nil {
		return proto.StdinResult{}, err
	}
	switch {
	case len(f.buf)+len(data) > proto.StdinBufferBytes:
		return proto.StdinResult{}, errorf(proto.ErrCodeUnavailable,
			"the stdin buffer of exec %s has room for %d bytes, the write has %d: retry once the command has read",
			id, max(proto.StdinBufferBytes-len(f.buf), 0), len(data))
	}
	f.buf = append(f.buf, data...)
	f.noteTyped(data)
	if closeAfter {
		f.closing = true
		if f.term != nil {
			f.buf = append(f.buf, f.term.eofBytes(f.lineOpen)...)
		}
	}
	select {
	case f.wake <- struct{}{}:
	default:
	}
	return proto.StdinResult{Written: int64(len(data)), Buffered: int64(len(f.buf)), Closed: f.closing}, nil
}

// noteTyped follows whether the bytes typed into a terminal left a line open.
func (f *stdinFeed) noteTyped(data []byte) {
	if f.term != nil && len(data) > 0 {
		last := data[len(data)-1]
		f.lineOpen = last != '\n' && last != '\r'
	}
}

// run writes the buffer into fd until the feed stops. It owns fd's writes (and a pipe's
// close).
func (f *stdinFeed) run() {
	defer close(f.done)
	defer f.release()
	stalls := 0
	for {
		f.mu.Lock()
		chunk := f.buf[:min(len(f.buf), stdinChunk)]
		closing, closed := f.closing, f.closed
		f.mu.Unlock()
		if closed {
			return
		}
		if len(chunk) == 0 {
			if closing {
				f.finish()
				return
			}
			select {
			case <-f.wake:
			case <-f.stop:
				return
			}
			continue
		}
		n, err := unix.Write(f.fd, chunk)
		if n > 0 {
			stalls = 0
			f.mu.Lock()
			if !f.closed { // else shutdown dropped the buffer meanwhile
				f.buf = f.buf[n:]
				if len(f.buf) == 0 {
					f.buf = nil
				}
			}
			f.mu.Unlock()
		}
		switch {
		case err == nil, errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EAGAIN):
			// Full: the command is not reading. Wait until it takes bytes or the feed stops;
			// a descriptor that claims room and takes nothing (a terminal whose line
			// discipline is full) is retried with a growing pause.
			if stalls > 0 {
				select {
				case <-f.stop:
					return
				case <-time.After(min(time.Duration(stalls)*time.Millisecond, stdinStall)):
				}
			}
			stalls++
			_, _ = unix.Poll([]unix.PollFd{{Fd: int32(f.fd), Events: unix.POLLOUT}}, int(stdinStall.Milliseconds()))
			select {
			case <-f.stop:
				return
			default:
			}
		default:
			// EPIPE (no reader is left), EIO (the terminal hung up), …: nothing will take
			// stdin any more.
			f.finish()
			return
		}
	}
}

// finish marks the feed closed and drops what it still held.
func (f *stdinFeed) finish() {
	f.mu.Lock()
	f.closed, f.buf = true, nil
	f.mu.Unlock()
}

// release closes a pipe's write end (the command reads EOF); a terminal's master stays open
// for the output and resizes, and its terminal closes it.
func (f *stdinFeed) release() {
	f.finish()
	if f.ownsFD {
		_ = syscall.Close(f.fd)
	}
}

// shutdown stops the feed because the command ended and waits until run returned.
func (f *stdinFeed) shutdown() {
	f.finish()
	f.stopOnce.Do(func() { close(f.stop) })
	<-f.done
}

// discard releases a feed whose run never started (the command did not start).
func (f *stdinFeed) discard() {
	f.release()
	f.stopOnce.Do(func() { close(f.stop) })
	close(f.done)
}

// handleStdin is POST /v1/execs/{id}/stdin?close=1: the body's raw bytes into the exec's stdin
// buffer (all or none), then, with close, stdin closed once they are drained.
func (s *Server) handleStdin(w http.ResponseWriter, r *http.Request) {
	e := s.lookup(r.PathValue("id"))
	if e == nil {
		writeError(w, errorf(proto.ErrCodeNotFound, "no exec %s", r.PathValue("id")))
		return
	}
	e.mu.Lock()
	in := e.in
	e.mu.Unlock()
	if in == nil {
		writeError(w, errorf(proto.ErrCodeState, "exec %s was started without open stdin", e.id))
		return
	}
	// Refused before the body is read; the write below checks again under the feed's lock,
	// which orders it against a close or the command's end.
	if perr := in.refusal(e.id); perr != nil {
		writeError(w, perr)
		return
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, proto.MaxStdinWrite+1))
	if err != nil {
		writeError(w, errorf(proto.ErrCodeInvalid, "reading the stdin bytes: %v", err))
		return
	}
	if len(data) > proto.MaxStdinWrite {
		writeError(w, errorf(proto.ErrCodeTooLarge, "a stdin write carries at most %d bytes", proto.MaxStdinWrite))
		return
	}
	res, perr := in.write(e.id, data, isTrue(r.URL.Query().Get("close")))
	if perr != nil {
		writeError(w, perr)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
