package execs

import (
	"context"
	"errors"

	"sandboxd/guest/proto"
	"sandboxd/internal/auth"
	"sandboxd/internal/execstream"
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
		if ge := (*proto.Error)(nil); m.State != execstream.Running && errors.As(err, &ge) && ge.Code == proto.ErrCodeNotFound {
			// Its guest forgot it (released once its exit was stored, or pushed out by newer
			// ones): it ended and left nothing running.
			return nil
		}
		return s.sandboxes.GuestError(ctx, m.Sandbox, err)
	}
	return nil
}
