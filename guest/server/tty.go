package server

import (
	"errors"
	"net/http"
	"os"
	"sync"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"sandboxd/guest/proto"
)

// A Tty exec runs under a pseudo-terminal of its own: the command is the leader of a new
// session whose controlling terminal is the pty's slave, which is its stdin, stdout and
// stderr. The server keeps only the master, as a raw non-blocking close-on-exec descriptor
// (so no other exec inherits it): the collector reads it into the exec's log as stdout
// records, the exec's stdinFeed writes the input into it, and resize sets its size.
//
// What ends a Tty exec is what ends a pipe exec: its main process (the session leader)
// exiting. The output is read until no process holds the terminal any more (the master then
// answers EIO) or for drainAfterExit, whichever comes first; the exit record follows, and then
// the master is closed, which hangs the terminal up: what the command left running gets
// SIGHUP and its reads and writes of the terminal fail from then on, as a pipe exec's
// leftovers get EPIPE once the output pipes are closed. Neither is killed by the exec's end
// (a background job that ignores SIGHUP runs on); a signal to the ended exec reaches them,
// with the exec's cgroup or by process group and parentage (Server.kill, killTree), and so do
// its timeout and the server's Close while it runs. Nothing on the server's side depends on
// the terminal's settings (raw mode, no echo) or on what the command does with its terminal
// (TIOCSTI pushes input at the command itself): output is the bytes the master gives, input
// the bytes written to it.
type terminal struct {
	fd int // the master

	mu     sync.Mutex
	size   proto.TtySize
	closed bool // fd is closed: no more ioctls
}

// openTerminal opens a pseudo-terminal of size and returns the server's side of it and the
// slave, for the child (close-on-exec, opened with O_NOCTTY so that PID 1 never takes it as its
// own controlling terminal).
func openTerminal(size proto.TtySize) (*terminal, *os.File, error) {
	master, slave, err := pty.Open()
	if err != nil {
		return nil, nil, err
	}
	// pty.Open's master is an *os.File that Fd() put in blocking mode. The server reads and
	// writes it like the output pipes, raw and non-blocking outside Go's poller (see
	// collector), so it keeps a descriptor of its own and closes the file. (For the same
	// reason the size is set with x/sys rather than pty.Setsize, which takes an *os.File.)
	fd, err := unix.FcntlInt(master.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	_ = master.Close()
	if err == nil {
		if err = unix.SetNonblock(fd, true); err == nil {
			err = setWinsize(fd, size)
		}
		if err != nil {
			_ = unix.Close(fd)
		}
	}
	if err != nil {
		_ = slave.Close()
		return nil, nil, err
	}
	return &terminal{fd: fd, size: size}, slave, nil
}

func setWinsize(fd int, size proto.TtySize) error {
	return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(size.Rows), Col: uint16(size.Cols)})
}

var errTerminalClosed = errors.New("the terminal is closed")

// resize sets the terminal's size; the kernel sends SIGWINCH to its foreground process group.
func (t *terminal) resize(size proto.TtySize) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errTerminalClosed
	}
	if err := setWinsize(t.fd, size); err != nil {
		return err
	}
	t.size = size
	return nil
}

func (t *terminal) currentSize() proto.TtySize {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.size
}

// eofBytes is what closing a terminal's stdin types: the terminal's end-of-file character
// (VEOF, ^D unless the command changed it) when the terminal is in canonical mode, twice when
// the last byte typed left a line open (the first one only ends that line, as at a keyboard),
// as the terminal is set when the close is taken. A terminal in non-canonical (raw) mode has
// no end of input: nothing is typed, and the command decides what ends its input.
func (t *terminal) eofBytes(lineOpen bool) []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	tio, err := unix.IoctlGetTermios(t.fd, unix.TCGETS) // on the master: the slave's settings
	if err != nil || tio.Lflag&unix.ICANON == 0 || tio.Cc[unix.VEOF] == 0 {
		return nil
	}
	eof := tio.Cc[unix.VEOF]
	if lineOpen {
		return []byte{eof, eof}
	}
	return []byte{eof}
}

// close closes the master, once nothing reads or writes it any more: the terminal hangs up.
func (t *terminal) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.closed {
		t.closed = true
		_ = unix.Close(t.fd)
	}
}

// handleResize is POST /v1/execs/{id}/resize: TtySize → ExecInfo.
func (s *Server) handleResize(w http.ResponseWriter, r *http.Request) {
	e := s.lookup(r.PathValue("id"))
	if e == nil {
		writeError(w, errorf(proto.ErrCodeNotFound, "no exec %s", r.PathValue("id")))
		return
	}
	var size proto.TtySize
	if err := readJSON(r, &size, 4<<10); err != nil {
		writeError(w, err)
		return
	}
	if !size.Valid() {
		writeError(w, errorf(proto.ErrCodeInvalid, "tty size %dx%d: rows and cols must be within %d..%d",
			size.Rows, size.Cols, proto.MinTtyCells, proto.MaxTtyCells))
		return
	}
	e.mu.Lock()
	term, ended := e.term, e.reaped
	e.mu.Unlock()
	switch {
	case term == nil:
		writeError(w, errorf(proto.ErrCodeState, "exec %s has no terminal", e.id))
		return
	case ended:
		writeError(w, errorf(proto.ErrCodeState, "exec %s has ended", e.id))
		return
	}
	if err := term.resize(size); err != nil {
		if errors.Is(err, errTerminalClosed) {
			writeError(w, errorf(proto.ErrCodeState, "exec %s has ended", e.id))
		} else {
			writeError(w, errorf(proto.ErrCodeInternal, "resizing the terminal: %v", err))
		}
		return
	}
	writeJSON(w, http.StatusOK, e.info())
}
