package execs

import (
	"context"
	"errors"
	"io"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/internal/apierror"
	"sandboxd/internal/execstream"
	"sandboxd/internal/sandbox"
	"sandboxd/runtime"
)

// follower copies one exec's guest log into its Redis stream while this replica holds the
// exec's follower lease. When a caller waits for the exec (a synchronous exec), it also
// collects the output for the answer, whether or not Redis takes it.
type follower struct {
	s    *Service
	meta execstream.Meta
	// fresh: this replica started the exec (it publishes EXEC_STARTED).
	fresh bool
	// unanswered: the sandbox did not answer the exec's start (client.ErrNoAnswer), so a log
	// it does not know means a command that never started.
	unanswered bool
	// pos is the guest log offset after the last record read; stored is the offset Redis has
	// (the start of the next Append).
	pos, stored int64
	// writing is false once the lease is lost: nothing more goes to Redis.
	writing bool
	// exitAppended: this follower put the exit status into the stream (exactly one does).
	exitAppended bool
	// startedSent is closed once EXEC_STARTED is published (nil when this follower publishes
	// none): EXEC_ENDED waits for it, so the two keep their order.
	startedSent chan struct{}
	wait        *collector
	result      chan followResult
}

// followResult is what a waiting caller gets: the collected result, or the error that ended
// the exec instead of the command (its sandbox failed).
type followResult struct {
	res sandbox.ExecResult
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
	// This replica's subscribers of the exec take its output from the follower's batches, each
	// as it goes to Redis; forget and stopWriting end that.
	s.store.BeginFeed(m.ID, offset)
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

// forget takes the exec off this replica's list of execs it follows; its subscribers here go
// back to reading Redis.
func (f *follower) forget() {
	// The feed ends first: a takeover on this replica, which waits for the exec to leave the
	// list, then begins its own, never ended by this one.
	f.s.store.EndFeed(f.meta.ID)
	f.s.followMu.Lock()
	delete(f.s.following, f.meta.ID)
	f.s.followMu.Unlock()
	f.answered()
}

// answered notes that the sandbox of an exec whose start it did not answer answered since (or
// that its follower ended): new starts on it are let through again.
func (f *follower) answered() {
	if !f.unanswered {
		return
	}
	s := f.s
	s.followMu.Lock()
	if s.stuck[f.meta.Sandbox] == f.meta.ID {
		delete(s.stuck, f.meta.Sandbox)
	}
	s.followMu.Unlock()
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
		// Beside the copying, not before it: the command's first output does not wait for the
		// event's round trip to Redis.
		f.startedSent = make(chan struct{})
		s.followers.Add(1)
		go func() {
			defer s.followers.Done()
			defer close(f.startedSent)
			s.publish(f.meta, sandbox.EventExecStarted, execResultOf(f.meta))
		}()
	}
	renew := time.NewTicker(s.cfg.ExecLease / 3)
	defer renew.Stop()
	idle := 0 // reopened logs in a row that broke before they brought a record
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
		from := f.pos
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
		// The log broke. One that broke before it brought a record is reopened after a pause
		// that grows by 0.1 s with each such break in a row, to 2 s: a command can garble its
		// own log's file in the sandbox (it runs as root there), and every reopen then meets
		// the same corrupt record; without the pause that was a tight loop of round trips into
		// the box on this replica.
		if f.pos != from {
			idle = 0
			continue
		}
		idle++
		select {
		case <-time.After(reopenPause(idle)):
		case <-s.bg.Done():
		}
	}
}

// reopenPause is how long a follower waits before it reopens a log that broke n times in a row
// without bringing a record.
func reopenPause(n int) time.Duration {
	return min(time.Duration(n)*100*time.Millisecond, 2*time.Second)
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
		err := s.store.Append(ctx, f.meta.ID, s.token, chunks, exit)
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
			f.stopWriting()
			return
		case errors.Is(err, execstream.ErrOffset):
			// Redis holds another offset than this follower (a takeover raced it): the lease
			// holder continues from the stored offset.
			s.log.Warn("exec stream offset mismatch; leaving it to the lease holder", "exec", f.meta.ID, "err", err)
			f.stopWriting()
			return
		}
		if s.now().After(deadline) || s.bg.Err() != nil {
			s.log.Warn("giving up copying an exec's output; another replica takes over", "exec", f.meta.ID, "err", err)
			f.stopWriting()
			return
		}
		s.log.Debug("appending exec output failed; retrying", "exec", f.meta.ID, "attempt", attempt, "err", err)
		select {
		case <-time.After(min(time.Duration(attempt+1)*100*time.Millisecond, time.Second)):
		case <-s.bg.Done():
		}
	}
}

// stopWriting stops this replica's writes to the exec's stream: another replica follows it
// now, or it is over. The exec's subscribers here go back to reading Redis.
func (f *follower) stopWriting() {
	f.writing = false
	f.s.store.EndFeed(f.meta.ID)
}

// renew extends the lease; losing it stops the copying.
func (f *follower) renew() {
	if !f.writing {
		return
	}
	s := f.s
	ctx, cancel := context.WithTimeout(s.bg, 5*time.Second)
	defer cancel()
	_, ok, err := s.store.TryFollow(ctx, f.meta.ID, s.token, s.now(), s.cfg.ExecLease)
	switch {
	case err == nil && !ok:
		s.log.Info("another replica follows the exec now", "exec", f.meta.ID)
		f.stopWriting()
	case errors.Is(err, execstream.ErrEnded), errors.Is(err, execstream.ErrNotFound):
		f.stopWriting()
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
		paused := false
		f.renew()
		if s.bg.Err() != nil || !f.writing && f.wait == nil {
			return nil, nil
		}
		ctx, cancel := context.WithTimeout(s.bg, 30*time.Second)
		box, err := s.sandboxes.Box(ctx, f.meta.Sandbox)
		cancel()
		switch {
		case errors.Is(err, runtime.ErrNotFound):
			return nil, errors.New("the sandbox was destroyed while the command ran")
		case err == nil && sandbox.State(box.Record.State).KeepsProcesses():
			// Paused (or on the way there or back): the command is kept with the sandbox's
			// memory and goes on after the resume, its log from the stored offset. Wait.
			paused = true
		case err == nil && box.Phase == runtime.PhaseFailed:
			// The sandbox died under the command (out of memory, crashed): it is FAILED now,
			// and a waiting caller gets SANDBOX_FAILED with its reason, not a result.
			octx, cancel := context.WithTimeout(s.bg, 30*time.Second)
			rec := s.sandboxes.Observe(octx, box)
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
			g, err := s.sandboxes.Guest(ctx, f.meta.Sandbox)
			cancel()
			if err == nil {
				var lr *client.LogReader
				s.metrics.logReopens.Inc()
				if lr, err = g.Log(s.bg, f.meta.ID, offset, true); err == nil {
					f.answered()
					f.pos = offset
					return lr, nil
				}
				var ge *proto.Error
				if errors.As(err, &ge) && ge.Code == proto.ErrCodeNotFound {
					if f.unanswered {
						return nil, errors.New("the command did not start: the sandbox did not answer its start and has no record of it")
					}
					return nil, errors.New("the sandbox restarted while the command ran; its end is unknown")
				}
			}
			s.log.Debug("reopening an exec log failed", "exec", f.meta.ID, "attempt", attempt, "err", err)
		default:
			s.log.Debug("looking up the sandbox of an exec failed", "exec", f.meta.ID, "err", err)
		}
		wait := min(time.Duration(attempt+1)*200*time.Millisecond, 2*time.Second)
		if paused {
			// A resume may come any time, or in days: look often at first, then every 2 s.
			wait = min(time.Duration(attempt+1)*50*time.Millisecond, 2*time.Second)
		}
		select {
		case <-time.After(wait):
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
	if f.exitAppended {
		// The stream holds the whole exec now: its guest's copy can go (release.go).
		s.released.add(f.meta.Sandbox, f.meta.ID)
	}
	if f.exitAppended && f.stored > 0 {
		// An exec that wrote something ran on this follower's goroutine (one that never
		// started is finished on its request's, which must not start a sweep: Close waits
		// for followers only).
		s.endedOutput(f.stored)
	}
	r := sandbox.ExecResult{ExecID: f.meta.ID, SandboxID: f.meta.Sandbox, Command: f.meta.Argv, StartedAt: f.meta.StartedAt, EndedAt: s.now()}
	if f.meta.TtyRows > 0 && f.meta.TtyCols > 0 {
		r.Tty = &sandbox.TtySize{Rows: f.meta.TtyRows, Cols: f.meta.TtyCols}
	}
	c := f.wait
	if c != nil {
		r.OutputBytes = outputBytes(c.written, exit)
	}
	applyExit(&r, exit)
	// The command's end is activity: auto-stop counts idle time from exactly here. It is
	// recorded beside EXEC_ENDED and the move to the ended index (three round trips to Redis
	// at once, not one after the other); all are done before a waiting caller gets its answer.
	touched := make(chan struct{})
	go func() {
		defer close(touched)
		s.sandboxes.TouchNow(s.bg, f.meta.Sandbox)
	}()
	if f.exitAppended {
		indexed := make(chan struct{})
		go func() {
			defer close(indexed)
			ctx, cancel := context.WithTimeout(s.bg, 5*time.Second)
			defer cancel()
			if err := s.store.Ended(ctx, f.meta.ID); err != nil {
				s.log.Debug("moving an ended exec to the ended index; the reconciler does it later", "exec", f.meta.ID, "err", err)
			}
		}()
		if f.startedSent != nil {
			<-f.startedSent
		}
		s.publish(f.meta, sandbox.EventExecEnded, r)
		<-indexed
	}
	<-touched
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
	if _, err := s.store.Release(ctx, f.meta.ID, s.token); err != nil {
		s.log.Debug("releasing an exec lease failed", "exec", f.meta.ID, "err", err)
	}
}

// publish puts an exec status event on the sandbox's project event stream.
func (s *Service) publish(m execstream.Meta, typ string, r sandbox.ExecResult) {
	ev := sandbox.ExecStatusEvent(typ, r, s.now().UTC())
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.bg), 5*time.Second)
	defer cancel()
	if _, err := s.events.Publish(ctx, m.Tenant, m.Project, ev); err != nil {
		s.log.Warn("publishing an exec event failed", "exec", m.ID, "err", err)
	}
}
