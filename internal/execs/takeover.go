package execs

import (
	"context"
	"time"
)

// ReconcileExecs follows the running execs nobody follows (their replica died or shut down)
// and, every ten seconds, deletes the streams of execs that ended longer ago than the retention
// or beyond the budget of ended output.
func (s *Service) ReconcileExecs(ctx context.Context) {
	now := s.now()
	orphans, err := s.store.Orphans(ctx, now)
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
		offset, ok, err := s.store.TryFollow(ctx, m.ID, s.token, s.now(), s.cfg.ExecLease)
		if err != nil || !ok {
			continue
		}
		s.log.Info("following an orphaned exec", "exec", m.ID, "sandbox", m.Sandbox, "offset", offset)
		s.newFollower(m, offset, false).start(nil)
	}
	if last := s.lastSweep.Load(); now.UnixNano()-last >= int64(10*time.Second) && s.lastSweep.CompareAndSwap(last, now.UnixNano()) {
		if n, err := s.store.Sweep(ctx, now); err != nil {
			s.log.Warn("sweeping ended execs failed", "err", err)
		} else if n > 0 {
			s.log.Debug("swept ended execs", "count", n)
		}
	}
}
