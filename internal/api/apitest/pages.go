package apitest

import (
	"context"
	"slices"
	"strings"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// MaxPage is the largest page SnapshotPage and AgentRunPage take (the service's default
// page size limit for snapshots).
const MaxPage = 500

// pageAfter cuts one page of items, in their order, after the item whose cursor is after
// ("": the first page): limit 0 is 50, over MaxPage INVALID_ARGUMENT, as is a cursor of no
// item.
func pageAfter[T any](items []T, cursor func(T) string, limit int, after string) ([]T, string, error) {
	if limit <= 0 {
		limit = 50
	}
	if limit > MaxPage {
		return nil, "", apierror.New(apierror.InvalidArgument, "page size must be at most %d, got %d", MaxPage, limit).WithDetail("field", "first")
	}
	if after != "" {
		i := 0
		for i < len(items) && cursor(items[i]) != after {
			i++
		}
		if i == len(items) {
			return nil, "", apierror.New(apierror.InvalidArgument, "malformed cursor %q", apierror.Truncate(after, 64)).WithDetail("field", "after")
		}
		items = items[i+1:]
	}
	if len(items) <= limit {
		return items, "", nil
	}
	return items[:limit], cursor(items[limit-1]), nil
}

// SnapshotPage pages ListSnapshots' answer (cursors: sandbox.SnapshotCursor).
func (f *Fake) SnapshotPage(ctx context.Context, p auth.Principal, sandboxID string, opts sandbox.SnapshotListOptions) (sandbox.SnapshotPage, error) {
	f.record(Call{Method: "SnapshotPage", Principal: p, SandboxID: sandboxID, Limit: opts.Limit, After: opts.After})
	f.mu.Lock()
	err, snaps := f.SnapshotErr, append([]sandbox.SnapshotInfo(nil), f.Snapshots...)
	f.mu.Unlock()
	if err != nil {
		return sandbox.SnapshotPage{}, err
	}
	if sandboxID != "" {
		if _, err := lookup(p, sandboxID); err != nil {
			return sandbox.SnapshotPage{}, err
		}
	}
	page, next, err := pageAfter(snaps, sandbox.SnapshotCursor, opts.Limit, opts.After)
	return sandbox.SnapshotPage{Snapshots: page, NextCursor: next}, err
}

// AgentRunPage pages ListAgentRuns' answer (cursors: run ids).
func (f *Fake) AgentRunPage(ctx context.Context, p auth.Principal, sandboxID string, opts sandbox.AgentRunListOptions) (sandbox.AgentRunPage, error) {
	f.record(Call{Method: "AgentRunPage", Principal: p, SandboxID: sandboxID, Limit: opts.Limit, After: opts.After})
	if sandboxID == "" {
		return sandbox.AgentRunPage{}, apierror.New(apierror.InvalidArgument, "sandbox_id is required")
	}
	if _, err := lookup(p, sandboxID); err != nil {
		return sandbox.AgentRunPage{}, err
	}
	f.mu.Lock()
	var runs []sandbox.AgentRun
	for _, r := range f.Runs {
		if r.SandboxID == sandboxID {
			runs = append(runs, r)
		}
	}
	f.mu.Unlock()
	slices.SortFunc(runs, func(a, b sandbox.AgentRun) int { return strings.Compare(a.ID, b.ID) }) // ListAgentRuns' order
	page, next, err := pageAfter(runs, func(r sandbox.AgentRun) string { return r.ID }, opts.Limit, opts.After)
	return sandbox.AgentRunPage{Runs: page, NextCursor: next}, err
}
