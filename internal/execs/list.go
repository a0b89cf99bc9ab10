package execs

import (
	"context"
	"strings"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/execstream"
	"sandboxd/internal/sandbox"
)

// defaultExecPage is a listing's page size when the caller names none.
const defaultExecPage = 50

// ListExecs returns a page of the execs of one of the caller's sandboxes, newest first,
// without their output: those the exec store still keeps (every running exec, and ended ones
// for their retention), whatever the sandbox's state, from any replica. opts.State filters by
// state; opts.After is the id of the last exec of the previous page.
func (s *Service) ListExecs(ctx context.Context, p auth.Principal, sandboxID string, opts sandbox.ExecListOptions) (sandbox.ExecPage, error) {
	limit := opts.Limit
	if limit == 0 {
		limit = defaultExecPage
	}
	if limit < 0 || limit > s.cfg.Limits.MaxPageSize {
		return sandbox.ExecPage{}, apierror.New(apierror.InvalidArgument, "page size must be between 1 and %d, got %d",
			s.cfg.Limits.MaxPageSize, limit).WithDetail("field", "limit")
	}
	if opts.After != "" && !sandbox.ValidID(opts.After, execPrefix) {
		return sandbox.ExecPage{}, apierror.New(apierror.InvalidArgument, "malformed cursor %q", apierror.Truncate(opts.After, 64)).
			WithDetail("field", "cursor")
	}
	var state execstream.State
	switch sandbox.ExecState(strings.ToUpper(string(opts.State))) {
	case "":
	case sandbox.ExecRunning:
		state = execstream.Running
	case sandbox.ExecEnded:
		state = execstream.Ended
	default:
		return sandbox.ExecPage{}, apierror.New(apierror.InvalidArgument, "state must be RUNNING or ENDED, got %q",
			apierror.Truncate(string(opts.State), 64)).WithDetail("field", "state")
	}
	if _, err := s.sandboxes.Load(ctx, p, sandboxID, sandbox.VerbGet); err != nil {
		return sandbox.ExecPage{}, err
	}
	metas, next, err := s.store.List(ctx, sandboxID, state, opts.After, limit)
	if err != nil {
		return sandbox.ExecPage{}, apierror.Wrap(err, apierror.Unavailable, "could not list the execs; retry").WithRetryAfter(time.Second)
	}
	page := sandbox.ExecPage{Execs: make([]sandbox.ExecResult, 0, len(metas)), NextCursor: next}
	for _, m := range metas {
		if m.Tenant != p.Tenant || m.Project != p.Project {
			continue // never another project's, whatever the index says
		}
		page.Execs = append(page.Execs, execResultOf(m))
	}
	return page, nil
}
