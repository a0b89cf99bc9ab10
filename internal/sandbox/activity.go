package sandbox

import (
	"context"
	"time"

	"sandboxd/runtime"
)

// Touch records activity on a sandbox (for auto-stop).
func (s *Service) Touch(ctx context.Context, id string) {
	if err := s.store.Touch(context.WithoutCancel(ctx), id, s.now()); err != nil {
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
