package execs

import (
	"context"
	"errors"
	"time"

	"sandboxd/guest/proto"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// MaxStdinWrite is the most bytes one WriteStdin carries (the guest init's bound).
const MaxStdinWrite = proto.MaxStdinWrite

// WriteStdin writes data to the stdin of a running exec that was started with stdin_open or a
// terminal, and closes its stdin after them when closeAfter is set. A write is taken whole or
// refused: more than MaxStdinWrite bytes is PAYLOAD_TOO_LARGE; bytes that do not fit in what
// is left of the exec's stdin buffer (the command has not read enough yet) are LIMIT_EXCEEDED
// ("limit_name": "stdin_buffer_bytes") with Retry-After; an exec whose stdin is not open (any
// more), or that ended, is INVALID_STATE. Any replica can write: it reaches the exec through
// the sandbox's guest init. sandboxID "" means any sandbox of the caller's project.
func (s *Service) WriteStdin(ctx context.Context, p auth.Principal, sandboxID, execID string, data []byte, closeAfter bool) (sandbox.StdinResult, error) {
	if len(data) > MaxStdinWrite {
		return sandbox.StdinResult{}, apierror.New(apierror.PayloadTooLarge, "one stdin write carries at most %d bytes, got %d",
			MaxStdinWrite, len(data)).WithDetail("limit", MaxStdinWrite)
	}
	m, err := s.runningExec(ctx, p, sandboxID, execID, "written to")
	if err != nil {
		return sandbox.StdinResult{}, err
	}
	if !m.StdinOpen {
		return sandbox.StdinResult{}, stdinNotOpen(execID)
	}
	g, err := s.sandboxes.Guest(ctx, m.Sandbox)
	if err != nil {
		return sandbox.StdinResult{}, err
	}
	res, err := g.WriteStdin(ctx, execID, data, closeAfter)
	if err != nil {
		var ge *proto.Error
		if errors.As(err, &ge) {
			switch ge.Code {
			case proto.ErrCodeUnavailable:
				return sandbox.StdinResult{}, apierror.Wrap(err, apierror.LimitExceeded,
					"the exec's stdin buffer (%d bytes) has no room for %d more bytes: the command has not read them yet; retry later",
					proto.StdinBufferBytes, len(data)).
					WithDetail("limit_name", "stdin_buffer_bytes").WithDetail("limit", proto.StdinBufferBytes).WithRetryAfter(time.Second)
			case proto.ErrCodeState:
				s.forgetStdin(ctx, execID)
				return sandbox.StdinResult{}, stdinNotOpen(execID)
			}
		}
		return sandbox.StdinResult{}, s.sandboxes.GuestError(ctx, m.Sandbox, err)
	}
	if res.Closed {
		s.forgetStdin(ctx, execID)
	}
	return sandbox.StdinResult{Written: res.Written, Buffered: res.Buffered, Closed: res.Closed}, nil
}

func stdinNotOpen(execID string) error {
	return apierror.New(apierror.InvalidState,
		"the stdin of exec %s is not open: it was closed, or the exec was started without stdin_open or tty", execID).
		WithDetail("stdin_open", false)
}

// forgetStdin records that an exec's stdin is closed, so that its status says so.
func (s *Service) forgetStdin(ctx context.Context, execID string) {
	if err := s.store.CloseStdin(context.WithoutCancel(ctx), execID); err != nil {
		s.log.Debug("recording a closed stdin failed", "exec", execID, "err", err)
	}
}

// ResizeTty sets the terminal size of a running exec started with a terminal (the command gets
// SIGWINCH) and answers the exec's status with the new size. An exec without a terminal, or
// that ended, is INVALID_STATE; rows and cols must each be 1 to 1000.
func (s *Service) ResizeTty(ctx context.Context, p auth.Principal, sandboxID, execID string, size sandbox.TtySize) (sandbox.ExecResult, error) {
	ts := proto.TtySize{Rows: size.Rows, Cols: size.Cols}
	if !ts.Valid() {
		return sandbox.ExecResult{}, apierror.New(apierror.InvalidArgument, "rows and cols must each be between %d and %d, got %dx%d",
			proto.MinTtyCells, proto.MaxTtyCells, size.Rows, size.Cols)
	}
	m, err := s.runningExec(ctx, p, sandboxID, execID, "resized")
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	if m.TtyRows == 0 {
		return sandbox.ExecResult{}, apierror.New(apierror.InvalidState, "exec %s does not run under a terminal (start it with tty)", execID)
	}
	g, err := s.sandboxes.Guest(ctx, m.Sandbox)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	if _, err := g.Resize(ctx, execID, ts); err != nil {
		return sandbox.ExecResult{}, s.sandboxes.GuestError(ctx, m.Sandbox, err)
	}
	if err := s.store.SetTty(context.WithoutCancel(ctx), execID, size.Rows, size.Cols); err != nil {
		s.log.Debug("recording a terminal size failed", "exec", execID, "err", err)
	}
	m.TtyRows, m.TtyCols = size.Rows, size.Cols
	return execResultOf(m), nil
}
