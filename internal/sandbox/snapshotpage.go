package sandbox

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/checkpoint"
)

// SnapshotListOptions asks for one page of snapshots.
type SnapshotListOptions struct {
	// Limit is the page size: 1 to Limits.MaxPageSize (0: 50).
	Limit int
	// After is the Cursor of the last snapshot of the previous page ("": the first page).
	After string
}

// SnapshotPage is one page of snapshots, newest first.
type SnapshotPage struct {
	Snapshots []SnapshotInfo
	// NextCursor is the cursor of the next page, "" on the last page.
	NextCursor string
}

// SnapshotCursor is the list cursor of a snapshot: its place in the order (created, then id,
// both descending), so that a page goes on after it even when that snapshot was deleted
// meanwhile.
func SnapshotCursor(s SnapshotInfo) string {
	return strconv.FormatInt(s.CreatedAt.UnixNano(), 10) + "." + s.ID
}

// maxSnapshotCursor bounds a cursor's length (a time, a dot and a snapshot id).
const maxSnapshotCursor = 96

// parseSnapshotCursor reads a SnapshotCursor.
func parseSnapshotCursor(c string) (time.Time, string, bool) {
	ns, id, ok := strings.Cut(c, ".")
	if !ok || len(c) > maxSnapshotCursor || !strings.HasPrefix(id, "snap_") {
		return time.Time{}, "", false
	}
	n, err := strconv.ParseInt(ns, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, "", false
	}
	return time.Unix(0, n).UTC(), id, true
}

// compareSnapshots orders snapshots newest first (created, then id, both descending).
func compareSnapshots(aAt time.Time, aID string, bAt time.Time, bID string) int {
	if c := bAt.Compare(aAt); c != 0 {
		return c
	}
	return cmp.Compare(bID, aID)
}

// SnapshotPage returns one page of the snapshots of one of the caller's sandboxes, or of the
// caller's whole project when sandboxID is "", newest first: at most opts.Limit (default 50,
// at most the page size limit, else INVALID_ARGUMENT) after opts.After (a malformed cursor is
// INVALID_ARGUMENT). A destroyed sandbox's snapshots are listed as long as any is left.
func (s *Service) SnapshotPage(ctx context.Context, p auth.Principal, sandboxID string, opts SnapshotListOptions) (SnapshotPage, error) {
	limit := opts.Limit
	if limit <= 0 {
		limit = 50
	}
	if limit > s.cfg.Limits.MaxPageSize {
		return SnapshotPage{}, apierror.New(apierror.InvalidArgument, "page size must be at most %d, got %d", s.cfg.Limits.MaxPageSize, limit).
			WithDetail("field", "first")
	}
	var afterAt time.Time
	var afterID string
	if opts.After != "" {
		var ok bool
		if afterAt, afterID, ok = parseSnapshotCursor(opts.After); !ok {
			return SnapshotPage{}, apierror.New(apierror.InvalidArgument, "malformed cursor %q", apierror.Truncate(opts.After, 64)).
				WithDetail("field", "after")
		}
	}
	var (
		list []checkpoint.Manifest
		err  error
	)
	if sandboxID == "" {
		list, err = s.ckpts.store.ListProject(ctx, p.Tenant, p.Project)
	} else {
		if !ValidID(sandboxID, idPrefix) {
			return SnapshotPage{}, notFound(sandboxID)
		}
		_, lerr := s.Load(ctx, p, sandboxID, VerbGet)
		if lerr != nil && !apierror.Is(lerr, apierror.NotFound) {
			return SnapshotPage{}, lerr
		}
		list, err = s.ckpts.store.List(ctx, checkpoint.Scope{Tenant: p.Tenant, Project: p.Project, Sandbox: sandboxID})
		if err == nil && lerr != nil && len(list) == 0 {
			return SnapshotPage{}, lerr // no such sandbox, and no snapshots left of one
		}
	}
	if err != nil {
		return SnapshotPage{}, storeError(err)
	}
	slices.SortFunc(list, func(a, b checkpoint.Manifest) int { return compareSnapshots(a.CreatedAt, a.ID, b.CreatedAt, b.ID) })
	if opts.After != "" {
		// The first snapshot after the cursor's place (the cursor's own may be gone).
		i, _ := slices.BinarySearchFunc(list, opts.After, func(m checkpoint.Manifest, _ string) int {
			if compareSnapshots(m.CreatedAt, m.ID, afterAt, afterID) <= 0 {
				return -1
			}
			return 1
		})
		list = list[i:]
	}
	var page SnapshotPage
	n := min(len(list), limit)
	page.Snapshots = make([]SnapshotInfo, 0, n)
	for _, m := range list[:n] {
		page.Snapshots = append(page.Snapshots, toSnapshotInfo(m))
	}
	if len(list) > limit {
		page.NextCursor = SnapshotCursor(page.Snapshots[n-1])
	}
	return page, nil
}
