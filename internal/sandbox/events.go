package sandbox

import (
	"context"
	"errors"
	"strconv"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/events"
)

// Events follows status events of one of the caller's sandboxes, or of the caller's whole
// project when sandboxID is "". after resumes after a cursor ("" = only new events).
func (s *Service) Events(ctx context.Context, p auth.Principal, sandboxID, after string) (<-chan Event, error) {
	if sandboxID != "" {
		if _, err := s.Load(ctx, p, sandboxID, VerbGet); err != nil {
			return nil, err
		}
	}
	if !events.ValidCursor(after) {
		return nil, apierror.New(apierror.InvalidArgument, "malformed cursor %q", apierror.Truncate(after, 64))
	}
	release, err := s.holdStream(p)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	in, err := s.events.Subscribe(sctx, p.Tenant, p.Project, sandboxID, after)
	if err != nil {
		cancel()
		release()
		if errors.Is(err, events.ErrTooManySubscribers) {
			return nil, apierror.Wrap(err, apierror.Unavailable, "this server follows as many subscriptions as it may; retry shortly").
				WithRetryAfter(5 * time.Second)
		}
		return nil, apierror.Wrap(err, apierror.Unavailable, "the event stream is unavailable")
	}
	out := make(chan Event)
	go func() {
		defer release()
		defer close(out)
		defer cancel() // ends the Redis reader too when we stop early
		for ev := range in {
			e := Event{Cursor: ev.Cursor, Type: ev.Type, SandboxID: ev.SandboxID, State: State(ev.Fields["state"]),
				PreviousState: State(ev.Fields["previous_state"]), Reason: ev.Fields["reason"], At: ev.At}
			switch ev.Type {
			case EventExecStarted, EventExecEnded:
				e.Exec = execEventResult(ev)
			case EventBootstrapProgress:
				e.BytesRead, _ = strconv.ParseInt(ev.Fields["bytes_read"], 10, 64)
			}
			select {
			case out <- e:
			case <-ctx.Done():
				return
			}
			if sandboxID != "" && e.State == Destroyed {
				// Nothing more will happen to this sandbox: end the subscription.
				return
			}
		}
	}()
	return out, nil
}
