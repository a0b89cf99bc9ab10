package execs

import (
	"context"
	"slices"
	"strings"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/execstream"
	"sandboxd/internal/sandbox"
)

// SignalExec sends a signal (one of sandbox.ExecSignals; "TERM" is "SIGTERM") to a running exec
// of the caller's sandbox and to every process it started: the guest init finds them in the
// exec's cgroup, or by process group and parentage where it has none. sandboxID "" means any
// sandbox of the caller's project. It answers the exec's status as it is then (the signal may
// take a moment to end it). An exec that ended is INVALID_STATE (with "state": "ENDED"):
// nothing is signalled.
func (s *Service) SignalExec(ctx context.Context, p auth.Principal, sandboxID, execID, signal string) (sandbox.ExecResult, error) {
	sig := strings.ToUpper(signal)
	if !strings.HasPrefix(sig, "SIG") {
		sig = "SIG" + sig
	}
	if !slices.Contains(sandbox.ExecSignals, sig) {
		return sandbox.ExecResult{}, apierror.New(apierror.InvalidArgument, "signal must be one of %s, got %q",
			strings.Join(sandbox.ExecSignals, ", "), apierror.Truncate(signal, 32)).WithDetail("field", "signal")
	}
	m, err := s.runningExec(ctx, p, sandboxID, execID, "signalled")
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	g, err := s.sandboxes.Guest(ctx, m.Sandbox)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	if err := g.Signal(ctx, execID, sig); err != nil {
		return sandbox.ExecResult{}, s.sandboxes.GuestError(ctx, m.Sandbox, err)
	}
	if now, err := s.store.Get(ctx, execID); err == nil {
		m = now
	}
	return execResultOf(m), nil
}

// runningExec loads an exec of the caller's project for a verb that needs it running, in its
// running sandbox: another project's exec is NOT_FOUND, an ended one INVALID_STATE.
func (s *Service) runningExec(ctx context.Context, p auth.Principal, sandboxID, execID, what string) (execstream.Meta, error) {
	m, err := s.loadExec(ctx, p, sandboxID, execID)
	if err != nil {
		return m, err
	}
	if m.State != execstream.Running {
		return m, apierror.New(apierror.InvalidState, "exec %s has ended; it cannot be %s", execID, what).
			WithDetail("state", string(sandbox.ExecEnded))
	}
	if _, err := s.sandboxes.Load(ctx, p, m.Sandbox, sandbox.VerbExec); err != nil {
		return m, err
	}
	return m, nil
}
