package execs

import (
	"context"

	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// CancelExec kills a running exec of the caller's sandbox with every process it started (the
// guest init finds them in the exec's cgroup, or by process group and parentage where it has
// none). An exec that ended already is left as it is.
func (s *Service) CancelExec(ctx context.Context, p auth.Principal, sandboxID, execID string) error {
	m, err := s.loadExec(ctx, p, sandboxID, execID)
	if err != nil {
		return err
	}
	if _, err := s.sandboxes.Load(ctx, p, m.Sandbox, sandbox.VerbExec); err != nil {
		return err
	}
	g, err := s.sandboxes.Guest(ctx, m.Sandbox)
	if err != nil {
		return err
	}
	if err := g.Signal(ctx, execID, "SIGKILL"); err != nil {
		return s.sandboxes.GuestError(ctx, m.Sandbox, err)
	}
	return nil
}
