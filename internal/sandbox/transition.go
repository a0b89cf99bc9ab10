package sandbox

import (
	"context"
	"errors"
	"log/slog"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/events"
	"sandboxd/internal/store"
	"sandboxd/runtime"
)

// setState moves a sandbox's record from one state to another (only if it is still in from),
// updates the lookup and publishes the event.
func (s *Service) setState(ctx context.Context, id string, from, to State, reason string) (runtime.Record, error) {
	return s.setStateWith(ctx, id, from, to, reason, nil)
}

// setStateWith is setState, with mark (when not nil) applied to the record in the same write:
// what the transition leaves besides the state, recorded atomically with it.
func (s *Service) setStateWith(ctx context.Context, id string, from, to State, reason string, mark func(*runtime.Record)) (runtime.Record, error) {
	ctx = context.WithoutCancel(ctx)
	rec, err := s.driver.UpdateRecord(ctx, id, func(r *runtime.Record) error {
		if State(r.State) != from {
			return apierror.New(apierror.InvalidState, "sandbox %s is %s, not %s", id, r.State, from).WithDetail("state", r.State)
		}
		if mark != nil {
			mark(r)
		}
		r.State = string(to)
		r.StateReason = reason
		r.StateChangedAt = s.now().UTC()
		switch to {
		case Running, Stopped, Destroyed, Paused:
			r.DesiredState = string(to)
		case Starting, Resuming:
			r.DesiredState = string(Running)
		case Pausing:
			r.DesiredState = string(Paused)
		case Stopping:
			r.DesiredState = string(Stopped)
		case Destroying:
			r.DesiredState = string(Destroyed)
		}
		return nil
	})
	if err != nil {
		if apierror.Is(err, apierror.InvalidState) {
			return rec, err
		}
		return rec, runtimeError(s.log, id, err, "could not record the sandbox's state")
	}
	if err := s.store.SetState(ctx, id, string(to)); errors.Is(err, store.ErrNotFound) {
		_ = s.store.Put(ctx, entryOf(rec))
	} else if err != nil {
		s.log.Warn("lookup state update failed; it is rebuilt from the runtime", "sandbox", id, "err", err)
	}
	s.publish(ctx, rec, from)
	return rec, nil
}

func (s *Service) publish(ctx context.Context, rec runtime.Record, prev State) {
	ev := events.Event{Type: EventStateChanged, SandboxID: rec.ID, At: s.now().UTC(),
		Fields: map[string]string{"state": rec.State, "previous_state": string(prev), "reason": rec.StateReason}}
	if _, err := s.events.Publish(context.WithoutCancel(ctx), rec.Tenant, rec.Project, ev); err != nil {
		s.log.Warn("publishing a sandbox event failed", "sandbox", rec.ID, "err", err)
	}
}

// transition runs a stateful verb: it takes the sandbox's operation lock, checks the table,
// moves the record to the verb's transient state, runs work and moves it to the target state
// (or back, when work fails and says so).
func (s *Service) transition(ctx context.Context, p auth.Principal, id string, verb Verb,
	work func(ctx context.Context, rec runtime.Record) (reason string, err error)) (runtime.Record, error) {
	start := s.now()
	if _, err := s.Load(ctx, p, id, verb); err != nil {
		return runtime.Record{}, err
	}
	lock, err := s.lock(ctx, id)
	if err != nil {
		return runtime.Record{}, err
	}
	defer lock.Unlock(ctx)
	ctx = runtime.WithFence(ctx, lock.Fence())
	// Load again under the lock: the state may have moved while we waited (and the read
	// cache may not have heard yet, so its copy goes).
	s.cache.forget(id)
	rec, err := s.Load(ctx, p, id, verb)
	if err != nil {
		return runtime.Record{}, err
	}
	transient, target, _ := verb.transient()
	from := State(rec.State)
	if rec, err = s.setState(ctx, id, from, transient, ""); err != nil {
		return rec, err
	}
	// The work must finish even if the client goes away: the record says where it is going.
	wctx := context.WithoutCancel(ctx)
	reason, werr := work(wctx, rec)
	if errors.Is(werr, runtime.ErrFenced) {
		// Another replica took the sandbox over after our lock ran out: it is that one's to
		// move on (or back), and our writes would be refused anyway.
		s.metrics.lifecycle(string(verb), "error", s.now().Sub(start))
		return rec, werr
	}
	if werr != nil {
		var back State
		var mark func(*runtime.Record)
		var la *leftAt
		switch {
		case errors.As(werr, &la):
			back, reason, mark = la.state, la.reason, la.mark
		case verb == VerbStart:
			back, reason = Failed, "start failed: "+apierror.From(werr).Message
		default:
			back = from
		}
		if _, err := s.setStateWith(wctx, id, transient, back, reason, mark); err != nil {
			s.log.Error("could not roll a failed transition back", "sandbox", id, "verb", verb, "err", err)
		}
		s.metrics.lifecycle(string(verb), "error", s.now().Sub(start))
		return rec, werr
	}
	if target == Destroyed {
		s.metrics.lifecycle(string(verb), "ok", s.now().Sub(start))
		return rec, nil
	}
	rec, err = s.setState(wctx, id, transient, target, reason)
	s.metrics.lifecycle(string(verb), outcome(err), s.now().Sub(start))
	return rec, err
}

// leftAt is the error of a transition's work that failed after it had changed the box: the
// sandbox is then in state (with reason, and mark applied to its record in the same write),
// not back where it came from.
type leftAt struct {
	err    error
	state  State
	reason string
	mark   func(*runtime.Record)
}

func (l *leftAt) Error() string { return l.err.Error() }
func (l *leftAt) Unwrap() error { return l.err }

// lock takes the sandbox's operation lock; a held one is INVALID_STATE with Retry-After. The
// caller makes its driver writes with the lock's fence (runtime.WithFence).
func (s *Service) lock(ctx context.Context, id string) (*store.Lock, error) {
	lock, err := s.store.Lock(ctx, id, s.cfg.LockTTL)
	if errors.Is(err, store.ErrLocked) {
		return nil, apierror.New(apierror.InvalidState, "sandbox %s: another operation is in flight, retry shortly", id).
			WithRetryAfter(busyRetryAfter)
	}
	if err != nil {
		return nil, apierror.Wrap(err, apierror.Unavailable, "the sandbox store is unavailable")
	}
	return lock, nil
}

// runtimeError is the error of a failed driver write to sandbox id: fencedOff's (logged on
// log) when the runtime refused the write for its fence, else UNAVAILABLE with msg.
func runtimeError(log *slog.Logger, id string, err error, msg string) error {
	if errors.Is(err, runtime.ErrFenced) {
		return fencedOff(log, id, err)
	}
	return apierror.Wrap(err, apierror.Unavailable, "%s", msg)
}

// fencedOff is the error of a driver write that the runtime refused because it carried an
// older fence than one the box has seen (runtime.ErrFenced): this replica's lock on the
// sandbox ran out while the operation was held up (a GC pause, a stopped process, a slow
// disk), and another replica took the lock and acted. Nothing was changed by the write.
//
// It is INVALID_STATE with Retry-After, the answer to a lock another operation holds: that is
// what happened, found out later (the sandbox is in another operation's hands, and a retry is
// checked against the state that one leaves), and the reconciler already takes INVALID_STATE
// for "another replica got there first". UNAVAILABLE would blame a component that is down;
// none is.
func fencedOff(log *slog.Logger, id string, err error) error {
	log.Warn("a runtime write was fenced off: this replica's operation lock ran out and another replica took the sandbox over",
		"sandbox", id, "err", err)
	return apierror.Wrap(err, apierror.InvalidState, "sandbox %s: another replica took over this sandbox's operation; retry", id).
		WithRetryAfter(busyRetryAfter)
}

func outcome(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// runtimeFailed is the error of a driver's failed create or start of sandbox id. When the box
// cannot run as specified (a pod the cluster cannot schedule, an image that cannot run) it
// says why.
func runtimeFailed(log *slog.Logger, id string, err error, msg string) error {
	if errors.Is(err, runtime.ErrFenced) {
		return fencedOff(log, id, err)
	}
	if se, ok := errors.AsType[*runtime.StartError](err); ok {
		return apierror.Wrap(err, apierror.Unavailable, "%s: %s", msg, se.Reason)
	}
	return apierror.Wrap(err, apierror.Unavailable, "%s", msg)
}
