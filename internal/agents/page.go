package agents

import (
	"cmp"
	"context"
	"slices"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// AgentRunPage returns one page of the runs of one of the caller's sandboxes, newest first by
// run id (a ULID): at most opts.Limit (default 50, at most the 100 runs kept, else
// INVALID_ARGUMENT) of those with an id below opts.After (a cursor that is not a run id is
// INVALID_ARGUMENT). A cursor stays good when its run is gone.
func (s *Service) AgentRunPage(ctx context.Context, p auth.Principal, sandboxID string, opts sandbox.AgentRunListOptions) (sandbox.AgentRunPage, error) {
	limit := opts.Limit
	if limit <= 0 {
		limit = 50
	}
	if limit > maxListRuns {
		return sandbox.AgentRunPage{}, apierror.New(apierror.InvalidArgument, "page size must be at most %d, got %d", maxListRuns, limit).
			WithDetail("field", "first")
	}
	if opts.After != "" && !sandbox.ValidID(opts.After, runPrefix) {
		return sandbox.AgentRunPage{}, apierror.New(apierror.InvalidArgument, "malformed cursor %q", apierror.Truncate(opts.After, 64)).
			WithDetail("field", "after")
	}
	runs, err := s.ListAgentRuns(ctx, p, sandboxID)
	if err != nil {
		return sandbox.AgentRunPage{}, err
	}
	return pageRuns(runs, limit, opts.After), nil
}

// pageRuns orders runs by id, newest first, and cuts the page after the cursor.
func pageRuns(runs []sandbox.AgentRun, limit int, after string) sandbox.AgentRunPage {
	slices.SortFunc(runs, func(a, b sandbox.AgentRun) int { return cmp.Compare(b.ID, a.ID) })
	if after != "" {
		i, _ := slices.BinarySearchFunc(runs, after, func(r sandbox.AgentRun, after string) int {
			if r.ID >= after {
				return -1
			}
			return 1
		})
		runs = runs[i:]
	}
	page := sandbox.AgentRunPage{Runs: runs[:min(len(runs), limit)]}
	if len(runs) > limit {
		page.NextCursor = page.Runs[limit-1].ID
	}
	return page
}
