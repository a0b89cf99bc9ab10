package execs

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/execstream"
	"sandboxd/internal/sandbox"
)

// Exec runs a command in the sandbox's workspace. It waits for the end and returns the
// collected result, or with req.Detach returns at once with the exec's id and state RUNNING.
// Either way the command runs to its end (or timeout) even when the caller goes away, and its
// output and status can be read from any replica (ExecOutput, GetExec).
func (s *Service) Exec(ctx context.Context, p auth.Principal, id string, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	start := s.now()
	timeout, err := s.validate(req)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	rec, err := s.sandboxes.Load(ctx, p, id, sandbox.VerbExec)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	endStart, err := s.beginStart(id)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	defer endStart()
	g, err := s.sandboxes.Guest(ctx, id)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	env := make([]string, 0, len(req.Env))
	for k, v := range req.Env {
		env = append(env, k+"="+v)
	}
	meta := execstream.Meta{ID: sandbox.NewID(execPrefix), Tenant: rec.Tenant, Project: rec.Project, Sandbox: id,
		Argv: execstream.Summarize(req.Command), StartedAt: start, State: execstream.Running,
		StdinOpen: req.StdinOpen || req.Tty != nil}
	var tty *proto.TtySize
	if req.Tty != nil {
		tty = &proto.TtySize{Rows: req.Tty.Rows, Cols: req.Tty.Cols}
		meta.TtyRows, meta.TtyCols = req.Tty.Rows, req.Tty.Cols
	}
	if err := s.store.Create(ctx, meta, s.token, start, s.cfg.ExecLease); err != nil {
		s.metrics.observe("error", s.now().Sub(start))
		return sandbox.ExecResult{}, apierror.Wrap(err, apierror.Unavailable, "could not record the exec; retry").WithRetryAfter(time.Second)
	}
	f := s.newFollower(meta, 0, !req.Detach)
	f.fresh = true
	trace.SpanFromContext(ctx).SetAttributes(keyExecID.String(meta.ID))
	// The log is read on the service's context: the command and its follower outlive the
	// request. Its guest call is still a span of the request's trace.
	lctx := trace.ContextWithSpanContext(s.bg, trace.SpanContextFromContext(ctx))
	greq := proto.ExecRequest{ID: meta.ID, Argv: req.Command, Env: env, Cwd: req.Cwd,
		TimeoutMs: timeout.Milliseconds(), Stdin: req.Stdin, StdinOpen: req.StdinOpen, Tty: tty, MaxRunning: s.cfg.MaxRunningExecs}
	lr, err := g.StartLog(lctx, greq)
	if err != nil && errors.Is(err, client.ErrClosed) && ctx.Err() == nil {
		// The cached attach broke, perhaps before the request went out (its end is noticed
		// asynchronously): once more on a new attach. The guest refuses a second start of the
		// same id, so a command that did start runs once and is followed from its log.
		_ = s.sandboxes.GuestError(ctx, id, err) // drops the broken attach
		if g, gerr := s.sandboxes.Guest(ctx, id); gerr == nil {
			lr, err = g.StartLog(lctx, greq)
			if ge := (*proto.Error)(nil); errors.As(err, &ge) && ge.Code == proto.ErrCodeExists {
				lr, err = nil, nil // the first start got through: the follower opens its log
			}
		}
	}
	endStart()
	if errors.Is(err, client.ErrNoAnswer) {
		// The sandbox took the start and did not answer it (stopped, starved): the command may
		// start yet. The follower looks for its log as after a broken attach, and the exec
		// ends with the command, or as never started once the sandbox answers that it has no
		// record of it. The caller hears now, with the exec's id.
		f.wait = nil
		f.unanswered = true
		s.followMu.Lock()
		if s.stuck[id] == "" {
			s.stuck[id] = meta.ID
		}
		s.followMu.Unlock()
		f.start(nil)
		s.metrics.observe("error", s.now().Sub(start))
		msg := err.Error()
		if ge := (*proto.Error)(nil); errors.As(err, &ge) {
			msg = ge.Message
		}
		return sandbox.ExecResult{}, apierror.Wrap(err, apierror.Unavailable, "%s: the exec's status says whether it did", msg).
			WithDetail("exec_id", meta.ID)
	}
	if err != nil {
		gerr := s.sandboxes.GuestError(ctx, id, err)
		// The command never started: end its stream so that no subscriber waits for it.
		f.finishUnstarted(gerr)
		s.metrics.observe("error", s.now().Sub(start))
		return sandbox.ExecResult{}, gerr
	}
	f.start(lr)
	if req.Detach {
		s.metrics.observe("detached", s.now().Sub(start))
		return execResultOf(meta), nil
	}
	// The sandbox ends the command at its timeout and reports the end; one that reports nothing
	// for endGrace more is stuck (its PID 1 stopped or starved): the caller is not held.
	bound := time.NewTimer(timeout + endGrace)
	defer bound.Stop()
	select {
	case out := <-f.result:
		if out.err != nil {
			// The sandbox died while the command ran (out of memory, crashed): not a result of
			// the command. The exec's stream still ends with an exit event carrying the error.
			s.metrics.observe("error", s.now().Sub(start))
			return sandbox.ExecResult{}, out.err
		}
		s.metrics.observe("ok", s.now().Sub(start))
		out.res.StartedAt = start
		return out.res, nil
	case <-ctx.Done():
		s.metrics.observe("error", s.now().Sub(start))
		return sandbox.ExecResult{}, apierror.Wrap(ctx.Err(), apierror.Unavailable,
			"the request was cancelled; the command runs on as exec %s", meta.ID).WithDetail("exec_id", meta.ID)
	case <-bound.C:
		s.metrics.observe("error", s.now().Sub(start))
		if box, err := s.sandboxes.Box(ctx, id); err == nil && sandbox.State(box.Record.State).KeepsProcesses() {
			// Not stuck: paused (or on the way there or back) while the command ran.
			return sandbox.ExecResult{}, apierror.New(apierror.InvalidState,
				"sandbox %s is %s: exec %s goes on after its resume, and its status will say how it ends", id, box.Record.State, meta.ID).
				WithDetail("exec_id", meta.ID).WithDetail("state", box.Record.State)
		}
		return sandbox.ExecResult{}, apierror.New(apierror.Unavailable,
			"the sandbox did not report the end of exec %s within its timeout (%s) and %s more; the exec's status will say how it ends",
			meta.ID, timeout, endGrace).WithDetail("exec_id", meta.ID)
	case <-s.bg.Done():
		return sandbox.ExecResult{}, apierror.New(apierror.Unavailable, "the server is shutting down; the command runs on as exec %s", meta.ID).
			WithDetail("exec_id", meta.ID).WithRetryAfter(time.Second)
	}
}

// beginStart admits a start on the sandbox, or refuses it while the sandbox looks stuck (the
// fields starting and stuck). end, which may be called more than once, ends the start's
// count once the sandbox answered it (or did not).
func (s *Service) beginStart(sandboxID string) (end func(), err error) {
	s.followMu.Lock()
	defer s.followMu.Unlock()
	if execID := s.stuck[sandboxID]; execID != "" {
		return nil, apierror.New(apierror.Unavailable,
			"the sandbox did not answer the start of exec %s and has not answered since: it looks stuck (its PID 1 stopped or starved); stop it, or retry later", execID).
			WithRetryAfter(5 * time.Second)
	}
	if n := s.starting[sandboxID]; n >= s.cfg.MaxRunningExecs {
		return nil, apierror.New(apierror.LimitExceeded, "%d starts wait on this sandbox's answer, the most allowed at once", n).
			WithDetail("limit_name", "running_execs_per_sandbox").WithRetryAfter(time.Second)
	}
	s.starting[sandboxID]++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.followMu.Lock()
			defer s.followMu.Unlock()
			if s.starting[sandboxID]--; s.starting[sandboxID] <= 0 {
				delete(s.starting, sandboxID)
			}
		})
	}, nil
}

// endGrace is how long past an exec's timeout a waiting caller waits for its end (a variable
// for tests).
var endGrace = 30 * time.Second

// keyExecID is internal/tracing's attribute of an exec's id: the request's span gets the id
// of the exec it started.
const keyExecID = attribute.Key("sandboxd.exec.id")

// validate checks an exec request against the limits and returns its timeout.
func (s *Service) validate(req sandbox.ExecRequest) (time.Duration, error) {
	l := s.cfg.Limits
	if len(req.Command) == 0 || req.Command[0] == "" {
		return 0, apierror.New(apierror.InvalidArgument, "command must be a non-empty array whose first element names the program, e.g. [\"bash\",\"-lc\",\"ls\"]").
			WithDetail("field", "command")
	}
	if len(req.Command) > l.ExecMaxArgs {
		return 0, apierror.New(apierror.InvalidArgument, "command has %d arguments, at most %d", len(req.Command), l.ExecMaxArgs)
	}
	n := 0
	for _, a := range req.Command {
		if strings.ContainsRune(a, 0) {
			return 0, apierror.New(apierror.InvalidArgument, "command arguments must not contain NUL bytes")
		}
		n += len(a)
	}
	if n > l.ExecMaxCommandBytes {
		return 0, apierror.New(apierror.PayloadTooLarge, "command is %d bytes, at most %d", n, l.ExecMaxCommandBytes)
	}
	if len(req.Stdin) > l.ExecMaxStdinBytes {
		return 0, apierror.New(apierror.PayloadTooLarge, "stdin is %d bytes, at most %d", len(req.Stdin), l.ExecMaxStdinBytes)
	}
	if len(req.Cwd) > l.MaxPathBytes || strings.ContainsRune(req.Cwd, 0) {
		return 0, apierror.New(apierror.InvalidArgument, "cwd must be a path of at most %d bytes", l.MaxPathBytes)
	}
	if err := l.CheckEnv(req.Env); err != nil {
		return 0, err
	}
	if t := req.Tty; t != nil && !(proto.TtySize{Rows: t.Rows, Cols: t.Cols}).Valid() {
		return 0, apierror.New(apierror.InvalidArgument, "tty rows and cols must each be between %d and %d, got %dx%d",
			proto.MinTtyCells, proto.MaxTtyCells, t.Rows, t.Cols).WithDetail("field", "tty")
	}
	t, err := sandbox.Bound("timeout_sec", req.TimeoutSec, l.ExecTimeoutDefaultSec, 1, l.ExecTimeoutMaxSec)
	if err != nil {
		return 0, err
	}
	return time.Duration(t) * time.Second, nil
}
