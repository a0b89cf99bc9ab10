package server

import (
	"fmt"
	"os"
	"syscall"

	"sandboxd/guest/proto"
)

// stdio is what a new exec's process gets as its descriptors 0–2 and what the server keeps of
// them: pipes (stdout and stderr apart; stdin /dev/null, or a pipe fed by a stdinFeed), or a
// terminal (one pseudo-terminal for all three, its master read for output and written for
// input).
type stdio struct {
	// child are the process's descriptors 0, 1 and 2.
	child [3]*os.File
	// owned are the child's ends the server opened for it (not /dev/null), closed in the
	// server once the process started (closeChild).
	owned []*os.File
	sys   *syscall.SysProcAttr
	// out are the output descriptors the collector reads, raw and non-blocking, with the
	// record kind of each; for a terminal its master alone.
	out   []int
	kinds []byte
	in    *stdinFeed // nil: stdin is /dev/null
	term  *terminal  // nil: pipes
}

// openStdio makes an exec's stdio for req. Its errors read as the start error of the command.
func (s *Server) openStdio(req proto.ExecRequest) (_ *stdio, err error) {
	sio := &stdio{}
	defer func() {
		if err != nil {
			sio.closeChild()
			sio.closeOurs()
		}
	}()
	if req.Tty != nil {
		term, slave, err := openTerminal(*req.Tty)
		if err != nil {
			return nil, fmt.Errorf("terminal: %w", err)
		}
		sio.term = term
		sio.owned = append(sio.owned, slave)
		sio.child = [3]*os.File{slave, slave, slave}
		// A session of its own, with the terminal as its controlling one: the command is the
		// session leader and its process group the terminal's foreground group (pgid = pid,
		// as Setpgid gives a pipe exec, which killTree relies on).
		sio.sys = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		sio.out, sio.kinds = []int{term.fd}, []byte{proto.RecordStdout}
		sio.in = newStdinFeed(term.fd, false, term, req.Stdin, false)
		return sio, nil
	}
	sio.sys = &syscall.SysProcAttr{Setpgid: true}
	sio.child[0] = s.devNull
	if len(req.Stdin) > 0 || req.StdinOpen {
		r, w, err := inputPipe()
		if err != nil {
			return nil, fmt.Errorf("stdin: %w", err)
		}
		sio.owned = append(sio.owned, r)
		sio.child[0] = r
		sio.in = newStdinFeed(w, true, nil, req.Stdin, !req.StdinOpen)
	}
	pipes, err := s.takePipes()
	if err != nil {
		return nil, fmt.Errorf("pipe: %w", err)
	}
	sio.out = append(sio.out, pipes.r[:]...)
	sio.owned = append(sio.owned, pipes.w[:]...)
	sio.child[1], sio.child[2] = sio.owned[len(sio.owned)-2], sio.owned[len(sio.owned)-1]
	sio.kinds = []byte{proto.RecordStdout, proto.RecordStderr}
	return sio, nil
}

// closeChild closes the server's copies of the child's ends.
func (sio *stdio) closeChild() {
	closeAll(sio.owned...)
	sio.owned = nil
}

// closeOurs closes the server's ends of a process that did not start (no feed runs yet).
func (sio *stdio) closeOurs() {
	if sio.in != nil {
		sio.in.discard()
	}
	sio.closeOutput()
}

// closeOutput closes the output descriptors once they were collected (a terminal's master
// only after its stdin feed stopped: the feed writes to it).
func (sio *stdio) closeOutput() {
	if sio.term != nil {
		sio.term.close()
	} else {
		for _, fd := range sio.out {
			_ = syscall.Close(fd)
		}
	}
	sio.out = nil
}
