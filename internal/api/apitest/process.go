package apitest

import (
	"context"
	"slices"
	"strings"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/execs"
	"sandboxd/internal/sandbox"
)

// ListExecs lists the known execs (Execs) of a sandboxID lookup accepts, newest (highest id)
// first, without output: filtered by opts.State, paged by opts.Limit (default 50) after
// opts.After; an unknown state is INVALID_ARGUMENT.
func (f *Fake) ListExecs(_ context.Context, p auth.Principal, sandboxID string, opts sandbox.ExecListOptions) (sandbox.ExecPage, error) {
	f.record(Call{Method: "ListExecs", Principal: p, SandboxID: sandboxID, ExecList: opts})
	if _, err := lookup(p, sandboxID); err != nil {
		return sandbox.ExecPage{}, err
	}
	state := sandbox.ExecState(strings.ToUpper(string(opts.State)))
	if state != "" && state != sandbox.ExecRunning && state != sandbox.ExecEnded {
		return sandbox.ExecPage{}, apierror.New(apierror.InvalidArgument, "state must be RUNNING or ENDED").WithDetail("field", "state")
	}
	limit := opts.Limit
	if limit == 0 {
		limit = 50
	}
	f.mu.Lock()
	var all []sandbox.ExecResult
	for _, e := range f.Execs {
		if e.SandboxID == sandboxID && (state == "" || e.State == state) && (opts.After == "" || e.ExecID < opts.After) {
			e.Stdout, e.Stderr, e.StdoutTruncated, e.StderrTruncated = nil, nil, false, false
			all = append(all, e)
		}
	}
	f.mu.Unlock()
	slices.SortFunc(all, func(a, b sandbox.ExecResult) int { return strings.Compare(b.ExecID, a.ExecID) })
	page := sandbox.ExecPage{Execs: all}
	if len(all) > limit {
		page.Execs, page.NextCursor = all[:limit], all[limit-1].ExecID
	}
	return page, nil
}

// runningExec finds a known exec of sandboxID ("" for any) that runs: NOT_FOUND for an unknown
// one or one of another sandbox, INVALID_STATE for an ended one.
func (f *Fake) runningExec(sandboxID, execID string) (sandbox.ExecResult, error) {
	f.mu.Lock()
	res, ok := f.Execs[execID]
	f.mu.Unlock()
	if !ok || (sandboxID != "" && sandboxID != res.SandboxID) {
		return sandbox.ExecResult{}, apierror.New(apierror.NotFound, "exec %s not found", execID)
	}
	if res.State != sandbox.ExecRunning {
		return sandbox.ExecResult{}, apierror.New(apierror.InvalidState, "exec %s has ended", execID).WithDetail("state", "ENDED")
	}
	res.Stdout, res.Stderr, res.StdoutTruncated, res.StderrTruncated = nil, nil, false, false
	return res, nil
}

// SignalExec answers a running exec's status; a signal not in sandbox.ExecSignals is
// INVALID_ARGUMENT.
func (f *Fake) SignalExec(_ context.Context, p auth.Principal, sandboxID, execID, signal string) (sandbox.ExecResult, error) {
	f.record(Call{Method: "SignalExec", Principal: p, SandboxID: sandboxID, ID: execID, Signal: signal})
	if !slices.Contains(sandbox.ExecSignals, signal) {
		return sandbox.ExecResult{}, apierror.New(apierror.InvalidArgument, "unknown signal %q", signal).WithDetail("field", "signal")
	}
	return f.runningExec(sandboxID, execID)
}

// WriteStdin takes every byte for a running exec (Buffered: all of them; Closed: closeAfter)
// unless StdinErr is set; more than execs.MaxStdinWrite bytes is PAYLOAD_TOO_LARGE.
func (f *Fake) WriteStdin(_ context.Context, p auth.Principal, sandboxID, execID string, data []byte, closeAfter bool) (sandbox.StdinResult, error) {
	f.record(Call{Method: "WriteStdin", Principal: p, SandboxID: sandboxID, ID: execID, Data: append([]byte(nil), data...), Close: closeAfter})
	if len(data) > execs.MaxStdinWrite {
		return sandbox.StdinResult{}, apierror.New(apierror.PayloadTooLarge, "one stdin write carries at most %d bytes", execs.MaxStdinWrite)
	}
	if _, err := f.runningExec(sandboxID, execID); err != nil {
		return sandbox.StdinResult{}, err
	}
	f.mu.Lock()
	stdinErr := f.StdinErr
	f.mu.Unlock()
	if stdinErr != nil {
		return sandbox.StdinResult{}, stdinErr
	}
	return sandbox.StdinResult{Written: int64(len(data)), Buffered: int64(len(data)), Closed: closeAfter}, nil
}

// ResizeTty answers a running exec's status with the new size.
func (f *Fake) ResizeTty(_ context.Context, p auth.Principal, sandboxID, execID string, size sandbox.TtySize) (sandbox.ExecResult, error) {
	f.record(Call{Method: "ResizeTty", Principal: p, SandboxID: sandboxID, ID: execID, Tty: size})
	if size.Rows < 1 || size.Cols < 1 || size.Rows > 1000 || size.Cols > 1000 {
		return sandbox.ExecResult{}, apierror.New(apierror.InvalidArgument, "rows and cols must each be between 1 and 1000")
	}
	res, err := f.runningExec(sandboxID, execID)
	if err != nil {
		return res, err
	}
	res.Tty, res.StdinOpen = &size, true
	return res, nil
}
