package sandbox

import (
	"context"
	"errors"
	"time"

	"sandboxd/guest"
	"sandboxd/internal/apierror"
	"sandboxd/runtime"
)

// attachment is this replica's attach stream to one sandbox's guest init, shared by every call.
type attachment struct {
	ready  chan struct{}
	client *guest.Client
	err    error
}

func (a *attachment) close() {
	<-a.ready
	if a.client != nil {
		a.client.Close()
	}
}

// Guest returns a client on the sandbox's guest init, attaching once per sandbox and replica.
func (s *Service) Guest(ctx context.Context, id string) (*guest.Client, error) {
	for {
		s.mu.Lock()
		a, ok := s.attachs[id]
		if !ok {
			a = &attachment{ready: make(chan struct{})}
			s.attachs[id] = a
			s.mu.Unlock()
			a.client, a.err = s.attach(ctx, id)
			close(a.ready)
			if a.err != nil {
				s.mu.Lock()
				if s.attachs[id] == a {
					delete(s.attachs, id)
				}
				s.mu.Unlock()
				return nil, a.err
			}
			return a.client, nil
		}
		s.mu.Unlock()
		select {
		case <-a.ready:
		case <-ctx.Done():
			return nil, apierror.Wrap(ctx.Err(), apierror.Unavailable, "the request was cancelled")
		}
		if a.err != nil {
			return nil, a.err
		}
		select {
		case <-a.client.Done():
			// The stream broke: forget it and attach again.
			s.mu.Lock()
			if s.attachs[id] == a {
				delete(s.attachs, id)
			}
			s.mu.Unlock()
			continue
		default:
			return a.client, nil
		}
	}
}

func (s *Service) attach(ctx context.Context, id string) (*guest.Client, error) {
	// The attach outlives the request that opened it.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	rwc, err := s.driver.Attach(actx, id)
	if err != nil {
		if errors.Is(err, runtime.ErrNotRunning) {
			box, gerr := s.driver.Get(actx, id)
			if gerr == nil && box.Phase == runtime.PhaseFailed {
				rec := s.Observe(actx, box)
				return nil, apierror.Wrap(err, apierror.SandboxFailed, "the sandbox failed: %s", rec.StateReason)
			}
		}
		return nil, apierror.Wrap(err, apierror.Unavailable, "could not attach to the sandbox").WithRetryAfter(time.Second)
	}
	c, err := guest.Dial(rwc)
	if err != nil {
		rwc.Close()
		return nil, apierror.Wrap(err, apierror.Unavailable, "the sandbox's init does not answer").WithRetryAfter(time.Second)
	}
	return c, nil
}

func (s *Service) dropAttach(id string) {
	s.mu.Lock()
	a, ok := s.attachs[id]
	delete(s.attachs, id)
	s.mu.Unlock()
	if ok {
		go a.close()
	}
}

// GuestError turns a failed guest call into a client error: a broken attach to a dead box
// marks the sandbox FAILED; a guest's own error keeps its meaning.
func (s *Service) GuestError(ctx context.Context, id string, err error) error {
	var ge *guest.Error
	if errors.As(err, &ge) {
		switch ge.Code {
		case guest.ErrCodeNotFound:
			return apierror.Wrap(err, apierror.NotFound, "%s", ge.Message)
		case guest.ErrCodeInvalid, guest.ErrCodeIsDir, guest.ErrCodeNotDir:
			return apierror.Wrap(err, apierror.InvalidArgument, "%s", ge.Message)
		case guest.ErrCodeTooLarge, guest.ErrCodeNoSpace:
			return apierror.Wrap(err, apierror.PayloadTooLarge, "%s", ge.Message)
		case guest.ErrCodeExists:
			return apierror.Wrap(err, apierror.AlreadyExists, "%s", ge.Message)
		case guest.ErrCodeUnavailable:
			return apierror.Wrap(err, apierror.Unavailable, "%s", ge.Message).WithRetryAfter(time.Second)
		case guest.ErrCodeTooMany:
			return apierror.Wrap(err, apierror.LimitExceeded, "%s", ge.Message).
				WithDetail("limit_name", "running_execs_per_sandbox").WithRetryAfter(time.Second)
		}
		return apierror.Wrap(err, apierror.Internal, "internal error")
	}
	if ctx.Err() != nil {
		return apierror.Wrap(err, apierror.Unavailable, "the request was cancelled")
	}
	s.dropAttach(id)
	box, gerr := s.driver.Get(context.WithoutCancel(ctx), id)
	if gerr == nil && box.Phase == runtime.PhaseFailed {
		rec := s.Observe(context.WithoutCancel(ctx), box)
		return apierror.Wrap(err, apierror.SandboxFailed, "the sandbox failed: %s", rec.StateReason).WithDetail("state", rec.State)
	}
	return apierror.Wrap(err, apierror.Unavailable, "lost the connection to the sandbox; retry").WithRetryAfter(time.Second)
}
