package agents

import (
	"context"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// AgentRunEvents streams a run: its status first, then the agent's output after the cursor
// after ("" = from the start), and its final status last, after which the channel closes. It
// also closes when ctx ends.
func (s *Service) AgentRunEvents(ctx context.Context, p auth.Principal, runID, after string) (<-chan sandbox.AgentRunEvent, error) {
	r, err := s.loadRun(ctx, p, runID)
	if err != nil {
		return nil, err
	}
	first := s.runView(ctx, p, r)
	var in <-chan sandbox.ExecEvent
	if first.ExecID != "" {
		in, err = s.execs.ExecOutput(ctx, p, first.ExecID, after)
		if err != nil && !apierror.Is(err, apierror.NotFound) {
			return nil, err
		}
	}
	out := make(chan sandbox.AgentRunEvent)
	go func() {
		defer close(out)
		send := func(ev sandbox.AgentRunEvent) bool {
			select {
			case out <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		if !send(sandbox.AgentRunEvent{Kind: sandbox.AgentRunStatusEvent, Cursor: after, Run: &first}) {
			return
		}
		cursor := after
		if in == nil {
			return // never ran, or its exec is gone: the status said it all
		}
		for ev := range in {
			cursor = ev.Cursor
			var e sandbox.AgentRunEvent
			switch ev.Kind {
			case sandbox.ExecChunk:
				e = sandbox.AgentRunEvent{Kind: sandbox.AgentRunChunk, Cursor: ev.Cursor, Stream: ev.Stream, Data: ev.Data}
			case sandbox.ExecTruncated:
				e = sandbox.AgentRunEvent{Kind: sandbox.AgentRunTruncated, Cursor: ev.Cursor, MissedBytes: ev.MissedBytes}
			default:
				continue
			}
			if !send(e) {
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		last, err := s.GetAgentRun(ctx, p, runID)
		if err != nil || first.Status.Terminal() && last.Status == first.Status {
			return
		}
		send(sandbox.AgentRunEvent{Kind: sandbox.AgentRunStatusEvent, Cursor: cursor, Run: &last})
	}()
	return out, nil
}
