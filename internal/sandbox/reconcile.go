package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/store"
	"sandboxd/runtime"
)

// The reconciler runs in every replica. Each pass lists the runtime (the truth) and, per
// sandbox: finishes a transition whose replica died half way (its lock has lapsed), marks a
// dead box FAILED, auto-stops an idle sandbox (never one with an exec still running), destroys
// an expired one (checkpointed first), and renews the concurrency-slot leases of every sandbox
// that holds one; then exec's part of the pass runs (ExecReconciler: orphaned execs followed
// on, ended ones swept). Actions go through the same code as the API verbs and take the same
// per-sandbox lock, so one sandbox is acted on by one replica at a time. Every driver write
// made under a lock carries the lock's fence (runtime.WithFence), which the runtime checks
// against the highest fence the box has seen, and every state change is conditional on the
// state it starts from: a replica whose lock lapsed while it was held up cannot write to the
// box once another replica took the lock and did.

// ExecReconciler is the exec side of a reconcile pass (internal/execs): it follows on the execs
// whose follower went away and sweeps the ended ones.
type ExecReconciler interface {
	ReconcileExecs(ctx context.Context)
}

// SetExecReconciler ends every reconcile pass with x's. Call it before the reconciler runs.
func (s *Service) SetExecReconciler(x ExecReconciler) { s.recon.execs = x }

// reconciler makes the passes: it drives the Service's own verbs and transitions, under the
// same locks, and ends each pass with exec's.
type reconciler struct {
	s     *Service
	execs ExecReconciler
	// pauseFailed counts, per sandbox, the auto-pauses in a row that failed with the sandbox
	// left running (pausesBeforeStop).
	mu          sync.Mutex
	pauseFailed map[string]int
}

// pausesBeforeStop is how many auto-pauses of one sandbox in a row may fail with it left
// running (a stuck guest that does not answer the pause's quiesce, a runtime that fails to
// save it) before the reconciler stops it instead: idle compute is released all the same.
const pausesBeforeStop = 3

// forgetPauseFailures drops the counts of sandboxes not running any more.
func (r *reconciler) forgetPauseFailures(running []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.pauseFailed) == 0 {
		return
	}
	keep := make(map[string]int, len(r.pauseFailed))
	for _, id := range running {
		if n := r.pauseFailed[id]; n > 0 {
			keep[id] = n
		}
	}
	r.pauseFailed = keep
}

// pauseFailedAgain counts a failed auto-pause of id and reports whether it is time to stop
// it instead; a nil err (the pause went through, or was not tried) clears the count.
func (r *reconciler) pauseFailedAgain(id string, err error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		delete(r.pauseFailed, id)
		return false
	}
	if r.pauseFailed == nil {
		r.pauseFailed = map[string]int{}
	}
	r.pauseFailed[id]++
	if r.pauseFailed[id] < pausesBeforeStop {
		return false
	}
	delete(r.pauseFailed, id)
	return true
}

// RunReconciler runs a pass every interval until ctx ends.
func (s *Service) RunReconciler(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		start := s.now()
		err := s.Reconcile(ctx)
		if ctx.Err() == nil {
			end := s.now()
			s.metrics.reconciled(end, end.Sub(start), err)
		}
		if err != nil && ctx.Err() == nil {
			s.log.Warn("reconcile pass failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Reconcile makes one pass over every sandbox of the runtime.
func (s *Service) Reconcile(ctx context.Context) error { return s.recon.pass(ctx) }

// pass is one reconcile pass (Reconcile).
func (r *reconciler) pass(ctx context.Context) error {
	s := r.s
	boxes, err := s.driver.List(ctx)
	if err != nil {
		return fmt.Errorf("listing the runtime: %w", err)
	}
	var running []string
	for _, b := range boxes {
		if State(b.Record.State) == Running {
			running = append(running, b.Record.ID)
		}
	}
	r.forgetPauseFailures(running)
	acts, err := s.store.Activity(ctx, running...)
	if err != nil {
		s.log.Warn("reading activity failed; no auto-stop in this pass", "err", err)
	}
	activityKnown := err == nil
	listed := map[[2]string][]string{}
	for _, b := range boxes {
		if holdsSlot(State(b.Record.State)) {
			k := [2]string{b.Record.Tenant, b.Record.Project}
			listed[k] = append(listed[k], b.Record.ID)
		}
	}
	stopRenewing := s.slots.keepRenewing(ctx, listed)
	defer stopRenewing()
	holders := map[[2]string][]string{}
	for _, b := range boxes {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		st := r.box(ctx, b, acts[b.Record.ID], activityKnown)
		if holdsSlot(st) {
			k := [2]string{b.Record.Tenant, b.Record.Project}
			holders[k] = append(holders[k], b.Record.ID)
		}
	}
	stopRenewing()
	s.slots.renew(ctx, holders)
	s.metrics.quotaUse(s.slots.use(holders))
	if r.execs != nil {
		r.execs.ReconcileExecs(ctx)
	}
	return nil
}

// box acts on one sandbox if something is due, and returns the state it leaves it in (as far
// as this pass knows). activityKnown is false when Redis could not say when the sandbox was
// last used: then it is not auto-stopped in this pass (its TTL still applies).
func (r *reconciler) box(ctx context.Context, b runtime.Box, activity time.Time, activityKnown bool) State {
	s := r.s
	rec := b.Record
	st := State(rec.State)
	now := s.now()
	p := auth.Principal{Key: systemKey, Tenant: rec.Tenant, Project: rec.Project}
	switch st {
	case Creating, Starting, Stopping, Destroying, Pausing, Resuming:
		// In flight, or left half done by a replica that died: its lock tells which.
		if now.Sub(rec.StateChangedAt) < s.cfg.LockTTL/3 {
			return st
		}
		return r.finish(ctx, b)
	case Running:
		if diedRunning(b) {
			return State(s.Observe(ctx, b).State)
		}
	case Paused:
		if token := rec.Annotations[annMemoryPending]; token != "" {
			s.storeMemory(rec, token) // its store failed, or its replica died before it ended
		}
	case Stopped:
		if rec.Annotations[annCheckpointOwed] != "" {
			s.payOwedCheckpoint(rec.ID) // its stop's read failed
		}
	}
	facts := ClockFacts{State: st, CreatedAt: rec.CreatedAt, TTLSec: rec.TTLSec, AutostopSec: rec.AutostopSec,
		LastActivity: lastActivity(activity, rec)}
	if !activityKnown {
		facts.AutostopSec = 0
	}
	switch DueAt(facts, now) {
	case DueExpire:
		why := fmt.Sprintf("expired: its ttl_sec of %d ended", rec.TTLSec)
		if _, err := s.destroy(ctx, p, rec.ID, Expired, why); err != nil {
			r.actionFailed(rec.ID, "expire", err)
			return st
		}
		s.log.Info("sandbox expired", "sandbox", rec.ID, "ttl_sec", rec.TTLSec)
		return Expired
	case DueAutostop:
		if r.busy(ctx, rec.ID) {
			// A command still runs: that is activity. The countdown starts again after it.
			s.Touch(ctx, rec.ID)
			return st
		}
		why := fmt.Sprintf("auto-stopped after %d s without activity", rec.AutostopSec)
		if rec.Annotations[annAutostopAction] == AutostopPause {
			sb, err := s.pause(ctx, p, rec.ID, fmt.Sprintf("auto-paused after %d s without activity", rec.AutostopSec))
			if err == nil {
				r.pauseFailedAgain(rec.ID, nil)
				s.log.Info("sandbox auto-paused", "sandbox", rec.ID, "autostop_sec", rec.AutostopSec, "state", sb.State)
				return sb.State
			}
			if !pauseRefused(err) && !r.pauseFailedAgain(rec.ID, err) {
				r.actionFailed(rec.ID, "auto-pause", err)
				return st
			}
			// It cannot be paused (its runtime cannot, or its guest refused, or the pause
			// failed pausesBeforeStop times in a row): idle compute is released all the same.
			why = fmt.Sprintf("auto-stopped after %d s without activity (it could not be paused: %s)", rec.AutostopSec, apierror.From(err).Message)
		}
		if _, err := s.stop(ctx, p, rec.ID, why); err != nil {
			r.actionFailed(rec.ID, "auto-stop", err)
			return st
		}
		s.log.Info("sandbox auto-stopped", "sandbox", rec.ID, "autostop_sec", rec.AutostopSec)
		return Stopped
	}
	return st
}

func (r *reconciler) actionFailed(id, action string, err error) {
	if apierror.Is(err, apierror.InvalidState) || apierror.Is(err, apierror.NotFound) {
		return // another replica or a user got there first
	}
	r.s.log.Warn("reconciler action failed", "sandbox", id, "action", action, "err", err)
}

// busyTimeout bounds busy's question to a sandbox's guest init (a variable for tests).
var busyTimeout = 10 * time.Second

// busy reports whether an exec is still running in the sandbox (asking its guest init).
func (r *reconciler) busy(ctx context.Context, id string) bool {
	// A guest that does not answer within busyTimeout counts as idle, as one that fails does:
	// a sandbox stuck (its PID 1 stopped) is auto-stopped, and holds the pass no longer.
	ctx, cancel := context.WithTimeout(ctx, busyTimeout)
	defer cancel()
	g, err := r.s.Guest(ctx, id)
	if err != nil {
		return false
	}
	execs, err := g.Execs(ctx)
	if err != nil {
		return false
	}
	for _, e := range execs {
		if e.Running {
			return true
		}
	}
	return false
}

// finish completes a transition whose replica is gone. It takes the sandbox's lock: when it
// is held, the transition is still in flight and nothing is done.
func (r *reconciler) finish(ctx context.Context, b runtime.Box) State {
	s := r.s
	rec := b.Record
	id := rec.ID
	lock, err := s.store.Lock(ctx, id, s.cfg.LockTTL)
	if errors.Is(err, store.ErrLocked) {
		return State(rec.State)
	}
	if err != nil {
		s.log.Warn("reconciler could not lock", "sandbox", id, "err", err)
		return State(rec.State)
	}
	defer lock.Unlock(ctx)
	ctx = runtime.WithFence(ctx, lock.Fence())
	// Read again under the lock, from the runtime itself: what the pass listed may have moved,
	// and a read cache's copy may be older still.
	b, err = s.raw.Get(ctx, id)
	if err != nil {
		return State(rec.State)
	}
	rec = b.Record
	from := State(rec.State)
	to, reason := from, ""
	// mark is applied to the record with the final state; after runs once it is written.
	var mark func(*runtime.Record)
	var after func(runtime.Record)
	switch from {
	case Creating:
		if b.Phase == runtime.PhaseRunning {
			// The creator may have died before or during its source's restore: restore it
			// (again: the import replaces the workspace, so this is idempotent).
			if err := s.boot.restore(ctx, rec); err != nil {
				to, reason = Failed, "creation was interrupted and its source could not be restored: "+apierror.From(err).Message
			} else if err := s.finishClaim(ctx, rec); err != nil { // a claim of a warm box (pool.go)
				to, reason = Failed, "creation was interrupted and its environment could not be set: "+apierror.From(err).Message
			} else {
				to = Running
			}
		} else {
			to, reason = Failed, "creation was interrupted (its control-plane replica stopped)"
		}
	case Starting:
		if b.Phase == runtime.PhaseRunning {
			to = Running
		} else if err := s.startWork(ctx, rec); err != nil {
			to, reason = Failed, "start failed: "+apierror.From(err).Message
		} else {
			to = Running
		}
	case Stopping:
		why, err := s.stopWork(ctx, rec)
		if err != nil {
			r.actionFailed(id, "finish stop", err)
			return from
		}
		to, reason = Stopped, why
	case Pausing:
		o, err := s.pauseWork(ctx, rec)
		switch {
		case err == nil:
			to, reason, mark = o.to, o.reason, o.mark
			after = func(rec runtime.Record) { s.pauseRecorded(rec, o) }
		case !s.boxDead(ctx, id):
			to = Running // the pause cannot be done; the box runs on as before
		default:
			r.actionFailed(id, "finish pause", err)
			return from
		}
	case Resuming:
		why, kept, err := s.resumeWork(ctx, rec)
		switch {
		case err == nil:
			to, reason = Running, why
		case kept:
			to = Paused // the image is intact; a caller resumes again
		default:
			to, reason = Failed, "resume failed: "+apierror.From(err).Message
		}
	case Destroying:
		if _, err := s.destroyWork(ctx, rec, Destroyed, ""); err != nil {
			r.actionFailed(id, "finish destroy", err)
			return from
		}
		s.log.Info("finished an interrupted destroy", "sandbox", id)
		return Destroyed
	default:
		return from
	}
	done, err := s.setStateWith(ctx, id, from, to, reason, mark)
	if err != nil {
		r.actionFailed(id, "finish", err)
		return from
	}
	if after != nil {
		after(done)
	}
	if !holdsSlot(to) {
		s.slots.release(ctx, rec.Tenant, rec.Project, id)
	}
	s.log.Info("finished an interrupted transition", "sandbox", id, "from", from, "to", to)
	return to
}

// SlotSource lists, from the runtime's records, the sandboxes of a tenant:project that hold a
// concurrency slot: what the quota is rebuilt from after Redis lost it.
func SlotSource(d runtime.Driver) func(ctx context.Context, tenant, project string) ([]string, error) {
	return func(ctx context.Context, tenant, project string) ([]string, error) {
		boxes, err := d.List(ctx)
		if err != nil {
			return nil, err
		}
		var ids []string
		for _, b := range boxes {
			if b.Record.Tenant == tenant && b.Record.Project == project && holdsSlot(State(b.Record.State)) {
				ids = append(ids, b.Record.ID)
			}
		}
		return ids, nil
	}
}
