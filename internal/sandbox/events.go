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

// EventsFunc follows status events of one of the caller's sandboxes, or of the caller's whole
// project when sandboxID is "", after a cursor ("" = only new events), handing each to
// deliver, in order, on the follower's goroutine (no goroutine of the caller's between: a
// subscription's resolver converts and sends on there). deliver returns false to stop. The
// stream ends when ctx ends, when deliver refuses, after a watched sandbox's DESTROYED, or
// when the event store fails for good; ended runs once then, after the last deliver, on the
// same goroutine.
func (s *Service) EventsFunc(ctx context.Context, p auth.Principal, sandboxID, after string, deliver func(Event) bool, ended func()) error {
	if sandboxID != "" {
		if _, err := s.Load(ctx, p, sandboxID, VerbGet); err != nil {
			return err
		}
	}
	if !events.ValidCursor(after) {
		return apierror.New(apierror.InvalidArgument, "malformed cursor %q", apierror.Truncate(after, 64))
	}
	release, err := s.HoldStream(p)
	if err != nil {
		return err
	}
	hand := func(ev events.Event) bool {
		e := Event{Cursor: ev.Cursor, Type: ev.Type, SandboxID: ev.SandboxID, State: State(ev.Fields["state"]),
			PreviousState: State(ev.Fields["previous_state"]), Reason: ev.Fields["reason"], At: ev.At}
		switch ev.Type {
		case EventExecStarted, EventExecEnded:
			e.Exec = execEventResult(ev)
		case EventBootstrapProgress:
			e.BytesRead, _ = strconv.ParseInt(ev.Fields["bytes_read"], 10, 64)
		}
		// After a watched sandbox's DESTROYED nothing more happens to it: the stream ends.
		return deliver(e) && (sandboxID == "" || e.State != Destroyed)
	}
	end := func() {
		ended()
		release()
	}
	if err := s.events.SubscribeFunc(ctx, p.Tenant, p.Project, sandboxID, after, hand, end); err != nil {
		release()
		if errors.Is(err, events.ErrTooManySubscribers) {
			return apierror.Wrap(err, apierror.Unavailable, "this server follows as many subscriptions as it may; retry shortly").
				WithRetryAfter(5 * time.Second)
		}
		return apierror.Wrap(err, apierror.Unavailable, "the event stream is unavailable")
	}
	return nil
}

// EventsCursor is the cursor of the newest status event of the caller's project now. Read it
// before a page of sandboxes: EventsFunc after it then gives every change since, none lost
// between the page and the subscription (some may be older than the page, and say nothing
// new).
func (s *Service) EventsCursor(ctx context.Context, p auth.Principal) (string, error) {
	c, err := s.events.LastCursor(ctx, p.Tenant, p.Project)
	if err != nil {
		return "", apierror.Wrap(err, apierror.Unavailable, "the event stream is unavailable").WithRetryAfter(time.Second)
	}
	return c, nil
}

// ExecStatusEvent is the event of an exec's start (EventExecStarted) or end (EventExecEnded)
// on its project's event stream, at time at; Events decodes it into Event.Exec. r carries the
// exec's id, sandbox, command and start, and its exit once ended.
func ExecStatusEvent(typ string, r ExecResult, at time.Time) events.Event {
	fields := map[string]string{"exec_id": r.ExecID, "command": r.Command, "state": string(Running),
		"exec_state": string(ExecRunning), "started_at": strconv.FormatInt(r.StartedAt.UnixMilli(), 10)}
	if r.State == ExecEnded {
		fields["exec_state"] = string(ExecEnded)
		fields["exit_code"] = strconv.Itoa(r.ExitCode)
		fields["signal"] = r.Signal
		fields["timed_out"] = strconv.FormatBool(r.TimedOut)
		fields["duration_ms"] = strconv.FormatInt(r.Duration.Milliseconds(), 10)
		fields["error"] = r.Error
		fields["ended_at"] = strconv.FormatInt(r.EndedAt.UnixMilli(), 10)
	}
	return events.Event{Type: typ, SandboxID: r.SandboxID, At: at, Fields: fields}
}

// execEventResult decodes the exec status of an EXEC_* event.
func execEventResult(ev events.Event) *ExecResult {
	f := ev.Fields
	r := &ExecResult{ExecID: f["exec_id"], SandboxID: ev.SandboxID, Command: f["command"], State: ExecState(f["exec_state"])}
	if ms, err := strconv.ParseInt(f["started_at"], 10, 64); err == nil {
		r.StartedAt = time.UnixMilli(ms).UTC()
	}
	if r.State == ExecEnded {
		r.ExitCode, _ = strconv.Atoi(f["exit_code"])
		r.Signal, r.Error = f["signal"], f["error"]
		r.TimedOut = f["timed_out"] == "true"
		if ms, err := strconv.ParseInt(f["duration_ms"], 10, 64); err == nil {
			r.Duration = time.Duration(ms) * time.Millisecond
		}
		if ms, err := strconv.ParseInt(f["ended_at"], 10, 64); err == nil {
			r.EndedAt = time.UnixMilli(ms).UTC()
		}
	}
	return r
}

// HoldStream takes one of the stream places of p's tenant:project on this replica (event and
// output streams, over REST and GraphQL alike): LIMIT_EXCEEDED when it holds them all. The
// places are fewer than the replica's total, so one project at its cap leaves room for others.
func (s *Service) HoldStream(p auth.Principal) (release func(), err error) {
	release, ok := s.streams.Acquire(p.Scope())
	if !ok {
		return nil, apierror.New(apierror.LimitExceeded,
			"tenant:project %s has %d streams open on this server, the most allowed; close one first", p.Scope(), s.streams.Cap()).
			WithDetail("limit_name", "streams_per_project").WithRetryAfter(5 * time.Second)
	}
	return release, nil
}
