package sandbox

import (
	"context"
	"time"

	"sandboxd/runtime"
)

// Touch records activity on a sandbox (for auto-stop). One replica writes one sandbox's
// activity at most once per touchEvery: an idle clock that counts minutes loses nothing, and a
// read does not cost a Redis write each time.
func (s *Service) Touch(ctx context.Context, id string) { s.touch(ctx, id, false) }

// TouchNow records activity that auto-stop counts from exactly, such as a command's end: it is
// written even when this replica wrote the sandbox's activity within touchEvery (a read's
// touch just before must not leave the clock up to touchEvery early).
func (s *Service) TouchNow(ctx context.Context, id string) { s.touch(ctx, id, true) }

func (s *Service) touch(ctx context.Context, id string, exact bool) {
	now := s.now()
	if !s.cache.shouldTouch(id, now, exact) {
		return
	}
	if err := s.store.Touch(context.WithoutCancel(ctx), id, now); err != nil {
		s.cache.untouch(id)
		s.log.Debug("recording activity failed", "sandbox", id, "err", err)
	}
}

// lastActivity is the later of the activity Redis reports and the last state change. After a
// loss of Redis's data the store reports the time of its rebuild instead of the lost activity
// (store.Activity), so an idle clock then restarts from the rebuild, never from an earlier
// state change.
func lastActivity(recorded time.Time, rec runtime.Record) time.Time {
	if recorded.After(rec.StateChangedAt) {
		return recorded
	}
	return rec.StateChangedAt
}

func (s *Service) withActivity(ctx context.Context, sb Sandbox) Sandbox {
	one := []Sandbox{sb}
	s.withActivities(ctx, one)
	return one[0]
}

// withActivities fills AutostopAt of running sandboxes from their recorded activity.
func (s *Service) withActivities(ctx context.Context, sbs []Sandbox) {
	var ids []string
	for _, sb := range sbs {
		if sb.State == Running {
			ids = append(ids, sb.ID)
		}
	}
	if len(ids) == 0 {
		return
	}
	acts, err := s.store.Activity(ctx, ids...)
	if err != nil {
		s.log.Debug("reading activity failed", "err", err)
	}
	setAutostops(sbs, acts)
}

// setAutostops sets the auto-stop deadline of sbs's running sandboxes from their last
// activity in acts (their last state change when later, or when acts lacks them).
func setAutostops(sbs []Sandbox, acts map[string]time.Time) {
	for i := range sbs {
		if sbs[i].State != Running {
			continue
		}
		last := acts[sbs[i].ID]
		if sbs[i].StateChangedAt.After(last) {
			last = sbs[i].StateChangedAt
		}
		sbs[i].AutostopAt = AutostopAt(last, sbs[i].AutostopSec)
	}
}
