package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/quota"
	"sandboxd/runtime"
)

// systemKey is the principal key of the control plane's own actions (the reconciler): they act
// as the sandbox's owner but are not activity.
const systemKey = "system:reconciler"

// slots are the concurrency slots of the tenant:projects, as leases in internal/quota (a nil
// quota: no limits).
type slots struct {
	quota *quota.Quota
	// driver is the runtime without the read cache (holders are checked against its truth).
	driver  runtime.Driver
	log     *slog.Logger
	metrics *Metrics
}

// acquire takes a concurrency slot for sandbox id of tenant:project.
func (s slots) acquire(ctx context.Context, tenant, project, id string) error {
	_, err := s.take(ctx, tenant, project, id)
	return err
}

// take is acquire that also tells whether id held a live slot already (the call renewed it).
func (s slots) take(ctx context.Context, tenant, project, id string) (held bool, err error) {
	if s.quota == nil {
		return false, nil
	}
	u, err := s.quota.Acquire(ctx, tenant, project, id)
	if err != nil {
		if apierror.Is(err, apierror.QuotaExceeded) {
			s.metrics.quotaRejections.Inc()
			return false, err
		}
		return false, apierror.Wrap(err, apierror.Unavailable, "the quota store is unavailable").WithRetryAfter(time.Second)
	}
	return u.Held, nil
}

// release gives sandbox id's slot back. A failure only delays it: the lease runs out.
func (s slots) release(ctx context.Context, tenant, project, id string) {
	if s.quota == nil {
		return
	}
	if err := s.quota.Release(context.WithoutCancel(ctx), tenant, project, id); err != nil {
		s.log.Warn("releasing a slot failed; its lease will run out", "sandbox", id, "err", err)
	}
}

// releaseUnlessHolding gives the slot back unless the sandbox is (still, or by another call)
// in a state that holds one. The runtime's record is read, never a read cache's copy: the
// change that gave the slot up may have been made on another replica a moment ago.
func (s slots) releaseUnlessHolding(ctx context.Context, tenant, project, id string) {
	s.releaseUnless(context.WithoutCancel(ctx), tenant, project, id, holdsSlot,
		"could not read a sandbox to see if it holds its slot; its lease decides")
}

// releaseUnless gives id's slot back unless the runtime's record, read now, is in a state
// keep reports. A runtime that does not answer (any error but ErrNotFound) leaves the slot to
// its lease, logged with msg: releasing it could let a create overshoot the limit while the
// sandbox runs, and a pass renews the lease only while the sandbox holds the slot.
func (s slots) releaseUnless(ctx context.Context, tenant, project, id string, keep func(State) bool, msg string) {
	box, err := s.driver.Get(ctx, id)
	if err == nil && keep(State(box.Record.State)) {
		return
	}
	if err != nil && !errors.Is(err, runtime.ErrNotFound) {
		s.log.Warn(msg, "sandbox", id, "err", err)
		return
	}
	s.release(ctx, tenant, project, id)
}

// holdsSlot reports whether a sandbox in state st holds a concurrency slot. A PAUSING one
// still runs; a RESUMING one took its slot before it began; a PAUSED one holds none.
func holdsSlot(st State) bool {
	return st == Creating || st == Starting || st == Running || st == Pausing || st == Resuming
}

// Quota reports the caller's concurrency limit and use.
func (s *Service) Quota(ctx context.Context, p auth.Principal) (quota.Usage, error) {
	if s.slots.quota == nil {
		return quota.Usage{}, nil
	}
	u, err := s.slots.quota.Usage(ctx, p.Tenant, p.Project)
	if err != nil {
		return quota.Usage{}, apierror.Wrap(err, apierror.Unavailable, "the quota store is unavailable")
	}
	return u, nil
}

// renew extends the leases of the sandboxes that hold a slot by runtime truth, and takes
// one again for a holder whose lease was lost (a Redis flush).
//
// holders is what a pass saw, and another replica may have moved a holder since: a CREATING
// sandbox whose lock another replica held while this pass looked at it, which that replica then
// marked FAILED and gave its slot back. Taking a slot for it again would hold one for a
// sandbox that holds none until the lease ran out (and refuse the project's next create). So a
// slot taken again is checked against the runtime's record read after the take, and given back
// unless the sandbox is in a state whose slot is released only after the state is left
// (retakes): whichever order the two replicas run in, no slot is left behind.
func (s slots) renew(ctx context.Context, holders map[[2]string][]string) {
	if s.quota == nil {
		return
	}
	for k, ids := range holders {
		missing, err := s.quota.Renew(ctx, k[0], k[1], ids)
		if err != nil {
			s.log.Warn("renewing slot leases failed", "tenant", k[0], "project", k[1], "err", err)
			continue
		}
		for _, id := range missing {
			if _, err := s.quota.Acquire(ctx, k[0], k[1], id); err != nil {
				s.log.Warn("a running sandbox has no slot and none is free", "sandbox", id, "err", err)
				continue
			}
			// Read after the take, so that whichever order this and another replica's
			// release run in, no slot is left behind (above).
			s.releaseUnless(ctx, k[0], k[1], id, retakes, "could not read a sandbox whose slot a pass took again; its lease decides")
		}
	}
}

// retakes reports whether a sandbox in state st whose slot is missing gets one again from a
// pass: a state that holds a slot and is left (by a write to the record) before the slot is
// given back. Not PAUSING: a pause gives its slot back once the compute is gone, before it
// records PAUSED; a PAUSING sandbox whose slot a flush lost is given one again by the next
// pass if its pause fails and it runs on.
func retakes(st State) bool {
	return st == Creating || st == Starting || st == Running || st == Resuming
}

// keepRenewing extends the leases of holders every quarter lease until stop is called: a
// reconcile pass runs it from its start (holders by the listed states) to its end, where renew
// takes over. One sandbox's action in a pass can take long (a stuck guest's calls run into
// their bounds, a large checkpoint), and a pass that outlived the lease would let every
// project's slots lapse and be taken by new creates. It only extends: a holder whose slot is
// gone meanwhile (the pass stopped it) is not given one again.
func (s slots) keepRenewing(ctx context.Context, holders map[[2]string][]string) (stop func()) {
	if s.quota == nil || len(holders) == 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(s.quota.Lease() / 4)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for k, ids := range holders {
				if _, err := s.quota.Renew(ctx, k[0], k[1], ids); err != nil && ctx.Err() == nil {
					s.log.Warn("renewing slot leases during a pass failed", "tenant", k[0], "project", k[1], "err", err)
				}
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// use is each tenant:project's slots held (holders, by runtime truth) against its limit, for
// the quota metrics; nil without a quota.
func (s slots) use(holders map[[2]string][]string) []quotaUse {
	if s.quota == nil {
		return nil
	}
	out := make([]quotaUse, 0, len(holders))
	for k, ids := range holders {
		out = append(out, quotaUse{held: len(ids), limit: s.quota.Limit(k[0], k[1])})
	}
	return out
}
