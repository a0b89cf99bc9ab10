package execs

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"sandboxd/guest/client"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/execstream"
	"sandboxd/internal/sandbox"
)

// GetExec returns an exec of the caller's project: its status, and with output its stdout and
// stderr as far as the bounded stream still holds them (each the newest bytes up to the exec
// output cap; *Truncated when the command wrote more than that). sandboxID, when not "", must
// be the exec's sandbox (else NOT_FOUND).
func (s *Service) GetExec(ctx context.Context, p auth.Principal, sandboxID, execID string, output bool) (sandbox.ExecResult, error) {
	if !output {
		m, err := s.loadExec(ctx, p, sandboxID, execID)
		if err != nil {
			return sandbox.ExecResult{}, err
		}
		return execResultOf(m), nil
	}
	// The status and the first of the output in one round trip; the status says whose it is
	// before anything read is used.
	if !sandbox.ValidID(execID, execPrefix) {
		return sandbox.ExecResult{}, execNotFound(execID)
	}
	const batch = 256
	m, evs, err := s.store.ReadFirst(ctx, execID, batch)
	switch {
	case errors.Is(err, execstream.ErrNotFound):
		return sandbox.ExecResult{}, s.execGone(execID)
	case err != nil:
		return sandbox.ExecResult{}, apierror.Wrap(err, apierror.Unavailable, "could not read the exec; retry").WithRetryAfter(time.Second)
	}
	if err := owned(p, sandboxID, m); err != nil {
		return sandbox.ExecResult{}, err
	}
	res := execResultOf(m)
	limit := s.cfg.Limits.ExecMaxOutputBytes
	stdout, stderr := client.Tail{Limit: limit}, client.Tail{Limit: limit}
	gap := false
	after := ""
	for first := true; ; first = false {
		if !first {
			evs, err = s.store.Read(ctx, execID, after, batch, 0)
		}
		if err != nil {
			if errors.Is(err, execstream.ErrNotFound) {
				break // swept while reading: what was read stands
			}
			return sandbox.ExecResult{}, apierror.Wrap(err, apierror.Unavailable, "could not read the exec's output; retry").WithRetryAfter(time.Second)
		}
		if len(evs) == 0 {
			break
		}
		exited := false
		for _, ev := range evs {
			switch ev.Kind {
			case execstream.EventTruncated:
				gap = true
			case execstream.EventChunk:
				if ev.Stream == execstream.Stderr {
					stderr.Write(ev.Data)
				} else {
					stdout.Write(ev.Data)
				}
			case execstream.EventExit:
				exited = true // nothing follows it
			}
			after = ev.Cursor
		}
		if exited || cursorOffset(after) >= m.Offset && m.State == execstream.Running {
			break // the whole output, or as far as the exec had come when asked: a busy command is not chased
		}
	}
	res.Stdout, res.Stderr = stdout.Bytes(), stderr.Bytes()
	res.StdoutTruncated, res.StderrTruncated = cutFlags(m.Exit, res.Stdout, res.Stderr, stdout.Cut() || gap, stderr.Cut() || gap)
	return res, nil
}

// ExecOutput replays an exec's output after the cursor after ("" = from the start) and then
// follows it live, from any replica: chunks in order, a truncated event wherever the bounded
// stream dropped output, and the exit event last, after which the channel closes. It also
// closes when ctx ends.
func (s *Service) ExecOutput(ctx context.Context, p auth.Principal, execID, after string) (<-chan sandbox.ExecEvent, error) {
	_, out, err := s.ExecOutputStatus(ctx, p, "", execID, after)
	return out, err
}

// ExecOutputStatus is ExecOutput of an exec of sandboxID ("" for any sandbox of the caller's
// project) that also returns the exec's status as the subscription found it: one round trip
// to Redis checks the exec, reads its status and the first output after the cursor. Another
// tenant's exec, or one of another sandbox, is NOT_FOUND whatever the cursor.
func (s *Service) ExecOutputStatus(ctx context.Context, p auth.Principal, sandboxID, execID, after string) (sandbox.ExecResult, <-chan sandbox.ExecEvent, error) {
	if !sandbox.ValidID(execID, execPrefix) {
		return sandbox.ExecResult{}, nil, execNotFound(execID)
	}
	sctx, cancel := context.WithCancel(ctx)
	var m execstream.Meta
	in, err := s.store.SubscribeAs(sctx, execID, after, func(got execstream.Meta) error {
		m = got
		return owned(p, sandboxID, got)
	})
	if err != nil {
		cancel()
		var coded *apierror.Error
		switch {
		case errors.Is(err, execstream.ErrNotFound):
			return sandbox.ExecResult{}, nil, s.execGone(execID)
		case errors.As(err, &coded):
			return sandbox.ExecResult{}, nil, err
		}
		return sandbox.ExecResult{}, nil, apierror.Wrap(err, apierror.Unavailable, "the exec's output stream is unavailable; retry").WithRetryAfter(time.Second)
	}
	release, err := s.sandboxes.HoldStream(p)
	if err != nil {
		cancel()
		return sandbox.ExecResult{}, nil, err
	}
	if n := s.subs.Add(1); n > int64(s.cfg.MaxExecSubscriptions) {
		s.subs.Add(-1)
		cancel()
		release()
		return sandbox.ExecResult{}, nil, apierror.New(apierror.Unavailable, "this server follows as many exec streams as it may; retry shortly").
			WithRetryAfter(5 * time.Second)
	}
	out := make(chan sandbox.ExecEvent)
	go func() {
		defer release()
		defer s.subs.Add(-1)
		defer close(out)
		defer cancel() // ends the Redis reader too when we stop early
		for ev := range in {
			if ev.Live {
				s.metrics.outputLive.Inc()
			} else {
				s.metrics.outputRedis.Inc()
			}
			e := sandbox.ExecEvent{Cursor: ev.Cursor}
			switch ev.Kind {
			case execstream.EventChunk:
				e.Kind, e.Stream, e.Data = sandbox.ExecChunk, string(ev.Stream), ev.Data
			case execstream.EventTruncated:
				e.Kind, e.MissedBytes = sandbox.ExecTruncated, ev.Missed
			case execstream.EventExit:
				e.Kind = sandbox.ExecExit
				r := s.endResult(context.WithoutCancel(ctx), m, ev)
				e.Result = &r
			default:
				continue
			}
			select {
			case out <- e:
			case <-ctx.Done():
				return
			}
		}
	}()
	return execResultOf(m), out, nil
}

// endResult is an exec's result at its exit event: m, the status its subscription began with,
// ended as the exit entry records it. The status is read again only when the entry does not
// say when the exec ended (an older version wrote it) or the exec ran under a terminal, whose
// size may have changed since m was read; when that read fails, m stands, ended.
func (s *Service) endResult(ctx context.Context, m execstream.Meta, ev execstream.Event) sandbox.ExecResult {
	if ev.End == nil || m.TtyRows > 0 {
		if got, err := s.store.Get(ctx, m.ID); err == nil {
			m = got
		}
	}
	if m.State != execstream.Ended {
		m.State, m.Exit = execstream.Ended, ev.Exit
		if ev.End != nil {
			m.EndedAt, m.Bytes = ev.End.At, ev.End.Bytes
		}
	}
	r := execResultOf(m)
	applyExit(&r, ev.Exit)
	return r
}

// loadExec reads an exec's status and checks that it belongs to the caller's project (and to
// sandboxID when given): another tenant's exec does not exist.
func (s *Service) loadExec(ctx context.Context, p auth.Principal, sandboxID, execID string) (execstream.Meta, error) {
	if !sandbox.ValidID(execID, execPrefix) {
		return execstream.Meta{}, execNotFound(execID)
	}
	m, err := s.store.Get(ctx, execID)
	if err != nil {
		if errors.Is(err, execstream.ErrNotFound) {
			return execstream.Meta{}, s.execGone(execID)
		}
		return execstream.Meta{}, apierror.Wrap(err, apierror.Unavailable, "could not read the exec; retry").WithRetryAfter(time.Second)
	}
	if err := owned(p, sandboxID, m); err != nil {
		return execstream.Meta{}, err
	}
	return m, nil
}

// owned is NOT_FOUND unless the exec m belongs to the caller's project (and to sandboxID when
// given).
func owned(p auth.Principal, sandboxID string, m execstream.Meta) error {
	if m.Tenant != p.Tenant || m.Project != p.Project || (sandboxID != "" && m.Sandbox != sandboxID) {
		return apierror.New(apierror.NotFound, "exec %q not found", m.ID)
	}
	return nil
}

// execNotFound is the error for an exec id that cannot be one.
func execNotFound(execID string) error {
	return apierror.New(apierror.NotFound, "exec %q not found", apierror.Truncate(execID, 64))
}

// execGone is the error for an exec Redis does not hold: never made, or ended and swept.
func (s *Service) execGone(execID string) error {
	return apierror.New(apierror.NotFound,
		"exec %q not found (unknown, or ended and dropped: ended execs are kept %s, the newest %d MiB of output in all)",
		execID, s.store.Retention(), s.store.MaxEndedBytes()>>20)
}

// cursorOffset is the guest log offset of an output cursor ("<offset>-<part>"), -1 if none.
func cursorOffset(cursor string) int64 {
	off, _, _ := strings.Cut(cursor, "-")
	n, err := strconv.ParseInt(off, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

func execResultOf(m execstream.Meta) sandbox.ExecResult {
	r := sandbox.ExecResult{ExecID: m.ID, SandboxID: m.Sandbox, Command: m.Argv, State: sandbox.ExecRunning,
		StartedAt: m.StartedAt, OutputBytes: m.Bytes, StdinOpen: m.StdinOpen && m.State == execstream.Running}
	if m.TtyRows > 0 && m.TtyCols > 0 {
		r.Tty = &sandbox.TtySize{Rows: m.TtyRows, Cols: m.TtyCols}
	}
	if m.State == execstream.Ended {
		r.State = sandbox.ExecEnded
		r.EndedAt = m.EndedAt
		r.OutputBytes = outputBytes(m.Bytes, m.Exit)
		applyExit(&r, m.Exit)
	}
	return r
}

// applyExit sets the exit fields of r from e. It may be applied more than once.
func applyExit(r *sandbox.ExecResult, e *execstream.Exit) {
	if e == nil {
		return
	}
	r.State = sandbox.ExecEnded
	r.StdinOpen = false
	r.ExitCode, r.Signal, r.TimedOut, r.Error = e.ExitCode, e.Signal, e.TimedOut, e.Error
	r.Duration = time.Duration(e.DurationMs) * time.Millisecond
	if counted(e) {
		r.OutputBytes = e.StdoutBytes + e.StderrBytes
	}
}

// counted reports whether the guest counted the command's output exactly. (A guest that
// counts reports 0 only for a command that wrote nothing, which then has nothing copied
// either: the fallbacks below give 0 as well.)
func counted(e *execstream.Exit) bool {
	return e != nil && e.StdoutBytes+e.StderrBytes > 0
}

// outputBytes is what the command wrote to stdout and stderr, kept or not: the guest's exact
// count when it has one, else the bytes copied plus what an older guest dropped at the end.
func outputBytes(copied int64, e *execstream.Exit) int64 {
	switch {
	case counted(e):
		return e.StdoutBytes + e.StderrBytes
	case e != nil:
		return copied + e.Dropped
	}
	return copied
}

// cutFlags says whether the kept stdout and stderr miss output the command wrote: exactly
// when the guest counted it, else the reader's own flags (a cap cut, a truncated event),
// and both when an older guest dropped the end.
func cutFlags(e *execstream.Exit, stdout, stderr []byte, stdoutCut, stderrCut bool) (bool, bool) {
	switch {
	case counted(e):
		return e.StdoutBytes > int64(len(stdout)), e.StderrBytes > int64(len(stderr))
	case e != nil && e.Dropped > 0:
		return true, true
	}
	return stdoutCut, stderrCut
}
