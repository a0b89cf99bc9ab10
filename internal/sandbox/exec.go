package sandbox

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/events"
	"sandboxd/internal/execstream"
	"sandboxd/runtime"
)

// Exec output travels in three hops. The guest init keeps each command's output in a log with
// byte offsets (the command outlives every client). Exactly one replica, the follower, copies
// that log into the exec's bounded Redis Stream (internal/execstream), fenced by a lease and
// the stored offset. Every replica serves readers from the stream. The replica that starts an
// exec follows it; when it dies, the reconciler of any replica finds the exec orphaned and
// follows on from the stored offset, so subscribers see every byte once and the exit status.

// Exec runs a command in the sandbox's workspace. It waits for the end and returns the
// collected result, or with req.Detach returns at once with the exec's id and state RUNNING.
// Either way the command runs to its end (or timeout) even when the caller goes away, and its
// output and status can be read from any replica (ExecOutput, GetExec).
func (s *Service) Exec(ctx context.Context, p auth.Principal, id string, req ExecRequest) (ExecResult, error) {
	start := s.now()
	timeout, err := s.validateExec(req)
	if err != nil {
		return ExecResult{}, err
	}
	rec, err := s.load(ctx, p, id, VerbExec)
	if err != nil {
		return ExecResult{}, err
	}
	g, err := s.guest(ctx, id)
	if err != nil {
		return ExecResult{}, err
	}
	env := make([]string, 0, len(req.Env))
	for k, v := range req.Env {
		env = append(env, k+"="+v)
	}
	meta := execstream.Meta{ID: newID(execPrefix), Tenant: rec.Tenant, Project: rec.Project, Sandbox: id,
		Argv: execstream.Summarize(req.Command), StartedAt: start}
	if err := s.execs.Create(ctx, meta, s.token, start, s.cfg.ExecLease); err != nil {
		s.metrics.exec("error", s.now().Sub(start))
		return ExecResult{}, apierror.Wrap(err, apierror.Unavailable, "could not record the exec; retry").WithRetryAfter(time.Second)
	}
	f := s.newFollower(meta, 0, !req.Detach)
	f.fresh = true
	// The log is read on the service's context: the command and its follower outlive the request.
	lr, err := g.StartLog(s.bg, proto.ExecRequest{ID: meta.ID, Argv: req.Command, Env: env, Cwd: req.Cwd,
		TimeoutMs: timeout.Milliseconds(), Stdin: req.Stdin, MaxRunning: s.cfg.MaxRunningExecs})
	if err != nil {
		gerr := s.guestError(ctx, id, err)
		// The command never started: end its stream so that no subscriber waits for it.
		f.finishUnstarted(gerr)
		s.metrics.exec("error", s.now().Sub(start))
		return ExecResult{}, gerr
	}
	f.start(lr)
	if req.Detach {
		s.metrics.exec("detached", s.now().Sub(start))
		return ExecResult{ExecID: meta.ID, SandboxID: id, Command: meta.Argv, State: ExecRunning, StartedAt: start}, nil
	}
	select {
	case out := <-f.result:
		if out.err != nil {
			// The sandbox died while the command ran (out of memory, crashed): not a result of
			// the command. The exec's stream still ends with an exit event carrying the error.
			s.metrics.exec("error", s.now().Sub(start))
			return ExecResult{}, out.err
		}
		s.metrics.exec("ok", s.now().Sub(start))
		out.res.StartedAt = start
		return out.res, nil
	case <-ctx.Done():
		s.metrics.exec("error", s.now().Sub(start))
		return ExecResult{}, apierror.Wrap(ctx.Err(), apierror.Unavailable,
			"the request was cancelled; the command runs on as exec %s", meta.ID).WithDetail("exec_id", meta.ID)
	case <-s.bg.Done():
		return ExecResult{}, apierror.New(apierror.Unavailable, "the server is shutting down; the command runs on as exec %s", meta.ID).
			WithDetail("exec_id", meta.ID).WithRetryAfter(time.Second)
	}
}

// GetExec returns an exec of the caller's project: its status, and with output its stdout and
// stderr as far as the bounded stream still holds them (each the newest bytes up to the exec
// output cap; *Truncated when the command wrote more than that). sandboxID, when not "", must
// be the exec's sandbox (else NOT_FOUND).
func (s *Service) GetExec(ctx context.Context, p auth.Principal, sandboxID, execID string, output bool) (ExecResult, error) {
	m, err := s.loadExec(ctx, p, sandboxID, execID)
	if err != nil {
		return ExecResult{}, err
	}
	res := execResultOf(m)
	if !output {
		return res, nil
	}
	limit := s.cfg.Limits.ExecMaxOutputBytes
	stdout, stderr := client.Tail{Limit: limit}, client.Tail{Limit: limit}
	gap := false
	after := ""
	for {
		evs, err := s.execs.Read(ctx, execID, after, 256, 0)
		if err != nil {
			if errors.Is(err, execstream.ErrNotFound) {
				break // swept while reading: what was read stands
			}
			return ExecResult{}, apierror.Wrap(err, apierror.Unavailable, "could not read the exec's output; retry").WithRetryAfter(time.Second)
		}
		if len(evs) == 0 {
			break
		}
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
			}
			after = ev.Cursor
		}
		if cursorOffset(after) >= m.Offset && m.State == execstream.Running {
			break // as far as the exec had come when asked: a busy command is not chased
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
func (s *Service) ExecOutput(ctx context.Context, p auth.Principal, execID, after string) (<-chan ExecEvent, error) {
	if _, err := s.loadExec(ctx, p, "", execID); err != nil {
		return nil, err
	}
	release, err := s.holdStream(p)
	if err != nil {
		return nil, err
	}
	if n := s.execSubs.Add(1); n > int64(s.cfg.MaxExecSubscriptions) {
		s.execSubs.Add(-1)
		release()
		return nil, apierror.New(apierror.Unavailable, "this server follows as many exec streams as it may; retry shortly").
			WithRetryAfter(5 * time.Second)
	}
	sctx, cancel := context.WithCancel(ctx)
	in, err := s.execs.Subscribe(sctx, execID, after)
	if err != nil {
		cancel()
		s.execSubs.Add(-1)
		release()
		var coded *apierror.Error
		if errors.As(err, &coded) {
			return nil, err
		}
		return nil, apierror.Wrap(err, apierror.Unavailable, "the exec's output stream is unavailable; retry").WithRetryAfter(time.Second)
	}
	out := make(chan ExecEvent)
	go func() {
		defer release()
		defer s.execSubs.Add(-1)
		defer close(out)
		defer cancel() // ends the Redis reader too when we stop early
		for ev := range in {
			e := ExecEvent{Cursor: ev.Cursor}
			switch ev.Kind {
			case execstream.EventChunk:
				e.Kind, e.Stream, e.Data = ExecChunk, string(ev.Stream), ev.Data
			case execstream.EventTruncated:
				e.Kind, e.MissedBytes = ExecTruncated, ev.Missed
			case execstream.EventExit:
				e.Kind = ExecExit
				// The exit entry carries the status; the rest (times, size) is in the meta hash.
				m, err := s.execs.Get(context.WithoutCancel(ctx), execID)
				var r ExecResult
				if err == nil {
					r = execResultOf(m)
				} else {
					r = ExecResult{ExecID: execID, State: ExecEnded}
				}
				applyExit(&r, ev.Exit)
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
	return out, nil
}

// loadExec reads an exec's status and checks that it belongs to the caller's project (and to
// sandboxID when given): another tenant's exec does not exist.
func (s *Service) loadExec(ctx context.Context, p auth.Principal, sandboxID, execID string) (execstream.Meta, error) {
	if !validPrefixedID(execID, execPrefix) {
		return execstream.Meta{}, apierror.New(apierror.NotFound, "exec %q not found", truncate(execID, 64))
	}
	m, err := s.execs.Get(ctx, execID)
	if err != nil {
		if errors.Is(err, execstream.ErrNotFound) {
			return execstream.Meta{}, apierror.New(apierror.NotFound,
				"exec %q not found (unknown, or ended and dropped: ended execs are kept %s, the newest %d MiB of output in all)",
				execID, s.execs.Retention(), s.execs.MaxEndedBytes()>>20)
		}
		return execstream.Meta{}, apierror.Wrap(err, apierror.Unavailable, "could not read the exec; retry").WithRetryAfter(time.Second)
	}
	if m.Tenant != p.Tenant || m.Project != p.Project || (sandboxID != "" && m.Sandbox != sandboxID) {
		return execstream.Meta{}, apierror.New(apierror.NotFound, "exec %q not found", execID)
	}
	return m, nil
}

const execPrefix = "exec_"

// cursorOffset is the guest log offset of an output cursor ("<offset>-<part>"), -1 if none.
func cursorOffset(cursor string) int64 {
	off, _, _ := strings.Cut(cursor, "-")
	n, err := strconv.ParseInt(off, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

func execResultOf(m execstream.Meta) ExecResult {
	r := ExecResult{ExecID: m.ID, SandboxID: m.Sandbox, Command: m.Argv, State: ExecRunning,
		StartedAt: m.StartedAt, OutputBytes: m.Bytes}
	if m.State == execstream.Ended {
		r.State = ExecEnded
		r.EndedAt = m.EndedAt
		r.OutputBytes = outputBytes(m.Bytes, m.Exit)
		applyExit(&r, m.Exit)
	}
	return r
}

// applyExit sets the exit fields of r from e. It may be applied more than once.
func applyExit(r *ExecResult, e *execstream.Exit) {
	if e == nil {
		return
	}
	r.State = ExecEnded
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

// ---- following ----

// follower copies one exec's guest log into its Redis stream while this replica holds the
// exec's follower lease. When a caller waits for the exec (a synchronous exec), it also
// collects the output for the answer, whether or not Redis takes it.
type follower struct {
	s    *Service
	meta execstream.Meta
	// fresh: this replica started the exec (it publishes EXEC_STARTED).
	fresh bool
	// pos is the guest log offset after the last record read; stored is the offset Redis has
	// (the start of the next Append).
	pos, stored int64
	// writing is false once the lease is lost: nothing more goes to Redis.
	writing bool
	// exitAppended: this follower put the exit status into the stream (exactly one does).
	exitAppended bool
	wait         *collector
	result       chan followResult
}

// followResult is what a waiting caller gets: the collected result, or the error that ended
// the exec instead of the command (its sandbox failed).
type followResult struct {
	res ExecResult
	err error
}

// collector keeps a waiting caller's output: the newest limit bytes of each stream.
type collector struct {
	stdout, stderr client.Tail
	// gap: the guest's log no longer held some output when it was read.
	gap     bool
	upTo    int64 // guest offset collected so far: a reopened log repeats nothing
	written int64 // output bytes seen, kept or cut
}

func (s *Service) newFollower(m execstream.Meta, offset int64, wait bool) *follower {
	f := &follower{s: s, meta: m, pos: offset, stored: offset, writing: true, result: make(chan followResult, 1)}
	if wait {
		limit := s.cfg.Limits.ExecMaxOutputBytes
		f.wait = &collector{upTo: offset, stdout: client.Tail{Limit: limit}, stderr: client.Tail{Limit: limit}}
	}
	s.followMu.Lock()
	s.following[m.ID] = true
	s.followMu.Unlock()
	return f
}

// start runs the follower in the background; lr is the guest log opened at f.pos, or nil to
// open it first (a takeover).
func (f *follower) start(lr *client.LogReader) {
	f.s.followers.Add(1)
	go func() {
		defer f.s.followers.Done()
		defer f.forget()
		f.follow(lr)
	}()
}

// finishUnstarted ends the stream of an exec the guest never started.
func (f *follower) finishUnstarted(cause error) {
	msg := cause.Error()
	var coded *apierror.Error
	if errors.As(cause, &coded) {
		msg = coded.Message
	}
	f.finish(&execstream.Exit{ExitCode: -1, Error: "the command did not start: " + msg})
	f.forget()
}

// forget takes the exec off this replica's list of execs it follows.
func (f *follower) forget() {
	f.s.followMu.Lock()
	delete(f.s.following, f.meta.ID)
	f.s.followMu.Unlock()
}

type logItem struct {
	rec client.Record
	err error
}

// One Append carries at most this many records and payload bytes.
const (
	maxBatchRecords = 256
	maxBatchBytes   = 1 << 20
)

// follow copies the exec's log until its exit status is in the stream, the lease is lost (and
// nobody waits here), or the service closes.
func (f *follower) follow(lr *client.LogReader) {
	s := f.s
	if f.fresh {
		s.publishExec(f.meta, EventExecStarted, nil)
	}
	renew := time.NewTicker(s.cfg.ExecLease / 3)
	defer renew.Stop()
	for {
		if lr == nil {
			// The log broke (or was never opened here): the attach went away because the sandbox
			// stopped, or the stream to it broke. Reopen it where Redis stands, or end the exec
			// when the sandbox is gone.
			var err error
			lr, err = f.reopen()
			if err != nil {
				msg := err.Error()
				var coded *apierror.Error
				if errors.As(err, &coded) {
					msg = coded.Message
				}
				f.finishWith(&execstream.Exit{ExitCode: -1, Error: msg}, err)
				return
			}
			if lr == nil {
				f.abandon()
				return
			}
		}
		items := make(chan logItem, 64)
		rctx, stopReader := context.WithCancel(s.bg)
		go readLog(rctx, lr, items)
		exit, stop := f.copy(items, renew.C)
		stopReader()
		lr.Close()
		for range items {
		}
		lr = nil
		switch {
		case exit != nil:
			f.finish(exit)
			return
		case stop:
			f.abandon()
			return
		}
	}
}

func readLog(ctx context.Context, lr *client.LogReader, out chan<- logItem) {
	defer close(out)
	for {
		rec, err := lr.Next()
		select {
		case out <- logItem{rec: rec, err: err}:
		case <-ctx.Done():
			return
		}
		if err != nil || rec.Kind == proto.RecordExit {
			return
		}
	}
}

// copy moves records from items into the stream, in batches of what is ready. It returns the
// exit status once the exit record was read (appended when this replica still writes), stop
// when this replica should stop following (the service closes, or the lease went to another
// replica and nobody waits here), and neither when the log broke.
func (f *follower) copy(items <-chan logItem, renew <-chan time.Time) (exit *execstream.Exit, stop bool) {
	s := f.s
	var batch []execstream.Chunk
	for {
		var it logItem
		var ok bool
		select {
		case it, ok = <-items:
		case <-renew:
			f.renew()
			if !f.writing && f.wait == nil {
				return nil, true
			}
			continue
		case <-s.bg.Done():
			return nil, true
		}
		batch, size := batch[:0], 0
	drain:
		for ok {
			if it.err != nil {
				if !errors.Is(it.err, io.EOF) {
					s.log.Debug("exec log broke", "exec", f.meta.ID, "err", it.err)
				}
				f.append(batch, nil)
				return nil, false
			}
			rec := it.rec
			f.collect(rec)
			if rec.Kind == proto.RecordExit {
				st, err := rec.ExitStatus()
				e := &execstream.Exit{ExitCode: st.ExitCode, Signal: st.Signal, TimedOut: st.TimedOut, DurationMs: st.DurationMs,
					Error: st.Error, StdoutBytes: st.StdoutBytes, StderrBytes: st.StderrBytes}
				if st.StdoutBytes+st.StderrBytes == 0 {
					// An older guest init: what it dropped was the end of the output.
					e.Dropped = st.DroppedBytes
				}
				if err != nil {
					e = &execstream.Exit{ExitCode: -1, Error: "the sandbox reported an unreadable exit status"}
				}
				f.pos = rec.Offset
				f.append(batch, e)
				return e, false
			}
			var stream execstream.Stream
			switch rec.Kind {
			case proto.RecordStdout:
				stream = execstream.Stdout
			case proto.RecordStderr:
				stream = execstream.Stderr
			default:
				// A RecordTruncated: the guest's log dropped output before this follower read
				// it. The stream records the hole, and every reader gets a truncated event in
				// its place. (A kind this version does not know counts as a hole too.)
				stream, rec.Data = execstream.Gap, nil
			}
			batch = append(batch, execstream.Chunk{Stream: stream, Data: rec.Data, Start: f.pos, Offset: rec.Offset})
			f.pos = rec.Offset
			size += len(rec.Data)
			if len(batch) >= maxBatchRecords || size >= maxBatchBytes {
				break
			}
			select {
			case it, ok = <-items:
			default:
				break drain
			}
		}
		f.append(batch, nil)
		if !ok {
			return nil, false
		}
		if !f.writing && f.wait == nil {
			return nil, true
		}
	}
}

func (f *follower) collect(rec client.Record) {
	c := f.wait
	if c == nil || rec.Offset <= c.upTo {
		return
	}
	c.upTo = rec.Offset
	switch rec.Kind {
	case proto.RecordStdout:
		c.written += int64(len(rec.Data))
		c.stdout.Write(rec.Data)
	case proto.RecordStderr:
		c.written += int64(len(rec.Data))
		c.stderr.Write(rec.Data)
	case proto.RecordTruncated:
		c.gap = true
	}
}

// append writes a batch (and the exit) while this replica is the follower, retrying failures
// of Redis itself until the lease would have lapsed; after that, or when another replica holds
// the lease, this replica stops writing.
func (f *follower) append(chunks []execstream.Chunk, exit *execstream.Exit) {
	s := f.s
	if !f.writing || len(chunks) == 0 && exit == nil {
		return
	}
	deadline := s.now().Add(s.cfg.ExecLease)
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(s.bg), 5*time.Second)
		err := s.execs.Append(ctx, f.meta.ID, s.token, chunks, exit)
		cancel()
		switch {
		case err == nil:
			if len(chunks) > 0 {
				f.stored = chunks[len(chunks)-1].Offset
			}
			f.exitAppended = exit != nil
			return
		case errors.Is(err, execstream.ErrNotFollower), errors.Is(err, execstream.ErrEnded), errors.Is(err, execstream.ErrNotFound):
			// Another replica follows now (our lease lapsed while we stalled), or it is over.
			s.log.Info("stopped copying an exec's output", "exec", f.meta.ID, "why", err)
			f.writing = false
			return
		case errors.Is(err, execstream.ErrOffset):
			// Redis holds another offset than this follower (a takeover raced it): the lease
			// holder continues from the stored offset.
			s.log.Warn("exec stream offset mismatch; leaving it to the lease holder", "exec", f.meta.ID, "err", err)
			f.writing = false
			return
		}
		if s.now().After(deadline) || s.bg.Err() != nil {
			s.log.Warn("giving up copying an exec's output; another replica takes over", "exec", f.meta.ID, "err", err)
			f.writing = false
			return
		}
		s.log.Debug("appending exec output failed; retrying", "exec", f.meta.ID, "attempt", attempt, "err", err)
		select {
		case <-time.After(min(time.Duration(attempt+1)*100*time.Millisecond, time.Second)):
		case <-s.bg.Done():
		}
	}
}

// renew extends the lease; losing it stops the copying.
func (f *follower) renew() {
	if !f.writing {
		return
	}
	s := f.s
	ctx, cancel := context.WithTimeout(s.bg, 5*time.Second)
	defer cancel()
	_, ok, err := s.execs.TryFollow(ctx, f.meta.ID, s.token, s.now(), s.cfg.ExecLease)
	switch {
	case err == nil && !ok:
		s.log.Info("another replica follows the exec now", "exec", f.meta.ID)
		f.writing = false
	case errors.Is(err, execstream.ErrEnded), errors.Is(err, execstream.ErrNotFound):
		f.writing = false
	case err != nil:
		s.log.Debug("renewing an exec lease failed", "exec", f.meta.ID, "err", err)
	}
}

// reopen opens the guest log again, at the offset Redis holds (or, once the lease is gone but a
// caller waits here, where the collector stands). It returns (nil, nil) when this replica
// should stop following, and an error when the exec cannot be followed to its end any more
// (the sandbox is gone or restarted): that error becomes the exec's end. When the sandbox
// failed, the error is SANDBOX_FAILED (and the sandbox is recorded FAILED).
func (f *follower) reopen() (*client.LogReader, error) {
	s := f.s
	for attempt := 0; ; attempt++ {
		f.renew()
		if s.bg.Err() != nil || !f.writing && f.wait == nil {
			return nil, nil
		}
		ctx, cancel := context.WithTimeout(s.bg, 30*time.Second)
		box, err := s.driver.Get(ctx, f.meta.Sandbox)
		cancel()
		switch {
		case errors.Is(err, runtime.ErrNotFound):
			return nil, errors.New("the sandbox was destroyed while the command ran")
		case err == nil && box.Phase == runtime.PhaseFailed:
			// The sandbox died under the command (out of memory, crashed): it is FAILED now,
			// and a waiting caller gets SANDBOX_FAILED with its reason, not a result.
			octx, cancel := context.WithTimeout(s.bg, 30*time.Second)
			rec := s.observe(octx, box)
			cancel()
			reason := rec.StateReason
			if reason == "" {
				reason = box.Reason
			}
			return nil, apierror.New(apierror.SandboxFailed, "the sandbox failed while the command ran: %s", reason).
				WithDetail("state", rec.State).WithDetail("exec_id", f.meta.ID)
		case err == nil && box.Phase != runtime.PhaseRunning:
			return nil, errors.New("the sandbox was stopped while the command ran")
		case err == nil:
			offset := f.stored
			if !f.writing {
				offset = f.wait.upTo
			}
			ctx, cancel := context.WithTimeout(s.bg, 30*time.Second)
			g, err := s.guest(ctx, f.meta.Sandbox)
			cancel()
			if err == nil {
				var lr *client.LogReader
				if lr, err = g.Log(s.bg, f.meta.ID, offset, true); err == nil {
					f.pos = offset
					return lr, nil
				}
				var ge *proto.Error
				if errors.As(err, &ge) && ge.Code == proto.ErrCodeNotFound {
					return nil, errors.New("the sandbox restarted while the command ran; its end is unknown")
				}
			}
			s.log.Debug("reopening an exec log failed", "exec", f.meta.ID, "attempt", attempt, "err", err)
		default:
			s.log.Debug("looking up the sandbox of an exec failed", "exec", f.meta.ID, "err", err)
		}
		select {
		case <-time.After(min(time.Duration(attempt+1)*200*time.Millisecond, 2*time.Second)):
		case <-s.bg.Done():
			return nil, nil
		}
	}
}

// finish puts the exit status into the stream (unless it is there already), records the
// command's end as activity, publishes EXEC_ENDED when this follower was the one to end the
// stream, and then answers a waiting caller: when a synchronous exec returns, its status and
// event are already visible from every replica.
func (f *follower) finish(exit *execstream.Exit) { f.finishWith(exit, nil) }

// finishWith is finish where cause, when not nil, is what a waiting caller gets instead of the
// result: the exec ended because its sandbox failed, not because the command did.
func (f *follower) finishWith(exit *execstream.Exit, cause error) {
	s := f.s
	if !f.exitAppended {
		f.append(nil, exit)
	}
	r := ExecResult{ExecID: f.meta.ID, SandboxID: f.meta.Sandbox, Command: f.meta.Argv, StartedAt: f.meta.StartedAt, EndedAt: s.now()}
	c := f.wait
	if c != nil {
		r.OutputBytes = outputBytes(c.written, exit)
	}
	applyExit(&r, exit)
	// The command's end is activity: auto-stop counts idle time from here.
	s.touch(s.bg, f.meta.Sandbox)
	if f.exitAppended {
		s.publishExec(f.meta, EventExecEnded, &r)
	}
	if c != nil {
		r.Stdout, r.Stderr = c.stdout.Bytes(), c.stderr.Bytes()
		r.StdoutTruncated, r.StderrTruncated = cutFlags(exit, r.Stdout, r.Stderr, c.stdout.Cut() || c.gap, c.stderr.Cut() || c.gap)
		f.result <- followResult{res: r, err: cause}
	}
}

// abandon hands the exec over: the lease is released (when still ours) so that another
// replica's reconciler follows on at once.
func (f *follower) abandon() {
	s := f.s
	if !f.writing {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.bg), 2*time.Second)
	defer cancel()
	if _, err := s.execs.Release(ctx, f.meta.ID, s.token); err != nil {
		s.log.Debug("releasing an exec lease failed", "exec", f.meta.ID, "err", err)
	}
}

// publishExec puts an exec status event on the sandbox's project event stream.
func (s *Service) publishExec(m execstream.Meta, typ string, r *ExecResult) {
	fields := map[string]string{"exec_id": m.ID, "command": m.Argv, "state": string(Running),
		"exec_state": string(ExecRunning), "started_at": strconv.FormatInt(m.StartedAt.UnixMilli(), 10)}
	if r != nil && r.State == ExecEnded {
		fields["exec_state"] = string(ExecEnded)
		fields["exit_code"] = strconv.Itoa(r.ExitCode)
		fields["signal"] = r.Signal
		fields["timed_out"] = strconv.FormatBool(r.TimedOut)
		fields["duration_ms"] = strconv.FormatInt(r.Duration.Milliseconds(), 10)
		fields["error"] = r.Error
		fields["ended_at"] = strconv.FormatInt(r.EndedAt.UnixMilli(), 10)
	}
	ev := events.Event{Type: typ, SandboxID: m.Sandbox, At: s.now().UTC(), Fields: fields}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.bg), 5*time.Second)
	defer cancel()
	if _, err := s.events.Publish(ctx, m.Tenant, m.Project, ev); err != nil {
		s.log.Warn("publishing an exec event failed", "exec", m.ID, "err", err)
	}
}

// execEventResult decodes the exec status of an EXEC_* event.
func execEventResult(ev events.Event) *ExecResult {
	f := ev.Fields
	r := &ExecResult{ExecID: f["exec_id"], SandboxID: ev.SandboxID, Command: f["command"], State: ExecState(f["exec_state"])}
	if ms, err := strconv.ParseInt(f["started_at"], 10, 64); err == nil {
		r.StartedAt = time.UnixMilli(ms).UTC()
	}
	if r.State == ExecEnded {
		r.ExitCode, _ = strconv.Atoi(f["exit_code"])
		r.Signal, r.Error = f["signal"], f["error"]
		r.TimedOut = f["timed_out"] == "true"
		if ms, err := strconv.ParseInt(f["duration_ms"], 10, 64); err == nil {
			r.Duration = time.Duration(ms) * time.Millisecond
		}
		if ms, err := strconv.ParseInt(f["ended_at"], 10, 64); err == nil {
			r.EndedAt = time.UnixMilli(ms).UTC()
		}
	}
	return r
}

// ---- takeover ----

// reconcileExecs follows the running execs nobody follows (their replica died or shut down)
// and, every ten seconds, deletes the streams of execs that ended longer ago than the retention
// or beyond the budget of ended output.
func (s *Service) reconcileExecs(ctx context.Context) {
	now := s.now()
	orphans, err := s.execs.Orphans(ctx, now)
	if err != nil {
		s.log.Warn("listing orphaned execs failed", "err", err)
	}
	for _, m := range orphans {
		s.followMu.Lock()
		mine := s.following[m.ID]
		s.followMu.Unlock()
		if mine {
			continue
		}
		offset, ok, err := s.execs.TryFollow(ctx, m.ID, s.token, s.now(), s.cfg.ExecLease)
		if err != nil || !ok {
			continue
		}
		s.log.Info("following an orphaned exec", "exec", m.ID, "sandbox", m.Sandbox, "offset", offset)
		s.newFollower(m, offset, false).start(nil)
	}
	if last := s.lastSweep.Load(); now.UnixNano()-last >= int64(10*time.Second) && s.lastSweep.CompareAndSwap(last, now.UnixNano()) {
		if n, err := s.execs.Sweep(ctx, now); err != nil {
			s.log.Warn("sweeping ended execs failed", "err", err)
		} else if n > 0 {
			s.log.Debug("swept ended execs", "count", n)
		}
	}
}

// holdStream takes one of the stream places of p's tenant:project on this replica (event and
// output streams, over REST and GraphQL alike): LIMIT_EXCEEDED when it holds them all. The
// places are fewer than the replica's total, so one project at its cap leaves room for others.
func (s *Service) holdStream(p auth.Principal) (release func(), err error) {
	release, ok := s.streams.Acquire(p.Scope())
	if !ok {
		return nil, apierror.New(apierror.LimitExceeded,
			"tenant:project %s has %d streams open on this server, the most allowed; close one first", p.Scope(), s.streams.Cap()).
			WithDetail("limit_name", "streams_per_project").WithRetryAfter(5 * time.Second)
	}
	return release, nil
}
