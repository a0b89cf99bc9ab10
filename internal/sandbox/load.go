package sandbox

import (
	"context"
	"errors"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/store"
	"sandboxd/runtime"
)

// Load finds the caller's sandbox id and checks verb against its state. Another project's
// sandbox, a malformed id and a missing one are all NOT_FOUND. A caller's load is activity.
// An exec or file call on a PAUSED sandbox created with auto_resume resumes it first.
func (s *Service) Load(ctx context.Context, p auth.Principal, id string, verb Verb) (runtime.Record, error) {
	rec, err := s.load(ctx, p, id, verb)
	if err != nil && autoResumes(rec, verb) {
		return s.autoResume(ctx, p, id, verb)
	}
	return rec, err
}

// load is Load without the auto-resume.
func (s *Service) load(ctx context.Context, p auth.Principal, id string, verb Verb) (runtime.Record, error) {
	if !ValidID(id, idPrefix) {
		return runtime.Record{}, notFound(id)
	}
	// A box in the read cache names its owner in its record (the truth the lookup caches):
	// the lookup is read only for a box this replica has not read lately.
	box, cached := s.cache.get(id)
	if !cached {
		// The lookup and the runtime's record are read at once: each is a round trip to
		// another process (Redis; a file and runsc's state, or the API server), and a request
		// that finds the cache lapsed (an agent's next command, seconds after the last) paid
		// both in turn, 0.4-0.9 ms each on a 2-core host. The box is used only once the lookup
		// said the caller owns it; reading it has no effect of its own. A lookup that refuses
		// answers without waiting for the read: a foreign tenant's 404 takes no longer for a
		// sandbox that exists than for one that does not.
		type boxOrError struct {
			box runtime.Box
			err error
		}
		read := make(chan boxOrError, 1)
		go func() {
			b, err := s.driver.Get(ctx, id)
			read <- boxOrError{b, err}
		}()
		e, err := s.store.Get(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return runtime.Record{}, notFound(id)
		}
		if err != nil {
			return runtime.Record{}, apierror.Wrap(err, apierror.Unavailable, "the sandbox store is unavailable")
		}
		if e.Tenant != p.Tenant || e.Project != p.Project {
			return runtime.Record{}, notFound(id)
		}
		got := <-read
		box, err = got.box, got.err
		if errors.Is(err, runtime.ErrNotFound) {
			// The lookup outlived the box (a create that died half way, a destroy elsewhere).
			_ = s.store.Delete(ctx, e)
			return runtime.Record{}, notFound(id)
		}
		if err != nil {
			return runtime.Record{}, apierror.Wrap(err, apierror.Unavailable, "the runtime is unavailable")
		}
	}
	if box.Record.Tenant != p.Tenant || box.Record.Project != p.Project {
		return runtime.Record{}, notFound(id)
	}
	rec := s.Observe(ctx, box)
	if p.Key != systemKey {
		s.Touch(ctx, id)
	}
	if err := Check(State(rec.State), verb, id); err != nil {
		if State(rec.State) == Failed && rec.StateReason != "" {
			if e := apierror.From(err); e.Code == apierror.InvalidState {
				e.Message += ": " + rec.StateReason
			}
		}
		return rec, err
	}
	return rec, nil
}

// Box is the runtime's box of sandbox id, as the driver reports it (its record and phase),
// read from the runtime itself, never the read cache: exec's follower asks after its log broke.
func (s *Service) Box(ctx context.Context, id string) (runtime.Box, error) {
	return s.raw.Get(ctx, id)
}

// Observe reconciles a record with what the driver sees: a box whose compute died while it was
// RUNNING is FAILED with the driver's reason, and that is written back to the record.
func (s *Service) Observe(ctx context.Context, box runtime.Box) runtime.Record {
	rec := box.Record
	if diedRunning(box) {
		reason := box.Reason
		if reason == "" {
			reason = "the sandbox's runtime died"
		}
		updated, err := s.setState(ctx, rec.ID, Running, Failed, reason)
		if err == nil {
			s.attachs.drop(rec.ID)
			s.slots.release(ctx, rec.Tenant, rec.Project, rec.ID)
			s.log.Warn("sandbox failed", "sandbox", rec.ID, "reason", reason, "lost", box.Lost)
			if box.Lost {
				s.recoverLost(updated)
			}
			return updated
		}
		rec.State, rec.StateReason = string(Failed), reason
	}
	return rec
}

// recoverLost starts a sandbox again whose compute the runtime lost (its pod deleted or
// evicted: the workspace is intact), on the service's lifetime. Only the replica whose write
// made it FAILED does this; it stays FAILED, with the reason, when the start cannot be done
// (the project's slots are full, the cluster cannot schedule it), for a caller to start later.
func (s *Service) recoverLost(rec runtime.Record) {
	s.recovering.Add(1)
	go func() {
		defer s.recovering.Done()
		p := auth.Principal{Key: systemKey, Tenant: rec.Tenant, Project: rec.Project}
		if _, err := s.Start(s.bg, p, rec.ID); err != nil {
			s.log.Warn("could not start again a sandbox whose compute was lost", "sandbox", rec.ID, "err", err)
			return
		}
		s.log.Info("started again a sandbox whose compute was lost", "sandbox", rec.ID)
	}()
}

// diedRunning reports a box whose compute died while its record says RUNNING: it is FAILED.
func diedRunning(b runtime.Box) bool {
	return b.Phase == runtime.PhaseFailed && State(b.Record.State) == Running
}
