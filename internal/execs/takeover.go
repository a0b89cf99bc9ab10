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
		s.sweep(ctx, now)
	}
}

// sweep deletes the streams of execs that ended longer ago than the retention or beyond the
// budget of ended output (execstream.Store.Sweep).
func (s *Service) sweep(ctx context.Context, now time.Time) {
	s.endedSinceSweep.Store(0)
	if n, err := s.store.Sweep(ctx, now); err != nil {
		if s.bg.Err() == nil {
			s.log.Warn("sweeping ended execs failed", "err", err)
		}
	} else if n > 0 {
		s.log.Debug("swept ended execs", "count", n)
	}
}

// endedOutput counts n bytes of output of an exec that ended here. Once the output ended since
// the last sweep reaches a quarter of the ended execs' budget (execstream's MaxEndedBytes), a
// sweep runs in the background, at most once a second, rather than at the reconciler's next
// one (every ten seconds): a burst of large outputs does not hold Redis's memory meanwhile,
// nor fill it.
func (s *Service) endedOutput(n int64) {
	if s.endedSinceSweep.Add(n) < s.store.MaxEndedBytes()/4 {
		return
	}
	now := s.now()
	last := s.lastSweep.Load()
	if now.UnixNano()-last < int64(time.Second) || !s.lastSweep.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	s.followers.Add(1)
	go func() {
		defer s.followers.Done()
		ctx, cancel := context.WithTimeout(s.bg, 30*time.Second)
		defer cancel()
		s.sweep(ctx, now)
	}()
}
