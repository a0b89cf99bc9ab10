package sandbox_test

import (
	"context"
	"slices"
	"testing"

	"sandboxd/internal/apierror"
	"sandboxd/internal/domain/domaintest"
	. "sandboxd/internal/sandbox"
)

// pageAll reads every page of SnapshotPage with the limit; it returns the ids and the page
// sizes.
func pageAll(t *testing.T, e *domaintest.Env, sandboxID string, limit int) ([]string, []int) {
	t.Helper()
	var ids []string
	var sizes []int
	after := ""
	for range 100 {
		page, err := e.Svc.SnapshotPage(context.Background(), alice, sandboxID, SnapshotListOptions{Limit: limit, After: after})
		if err != nil {
			t.Fatalf("page after %q: %v", after, err)
		}
		ids = append(ids, snapshotIDs(page.Snapshots)...)
		sizes = append(sizes, len(page.Snapshots))
		if page.NextCursor == "" {
			return ids, sizes
		}
		if len(page.Snapshots) == 0 || page.NextCursor != SnapshotCursor(page.Snapshots[len(page.Snapshots)-1]) {
			t.Fatalf("page after %q: got next cursor %q for %v, want the last snapshot's", after, page.NextCursor, snapshotIDs(page.Snapshots))
		}
		after = page.NextCursor
	}
	t.Fatal("SnapshotPage never ended")
	return nil, nil
}

// TestSnapshotPages: pages of snapshots, newest first, hold every snapshot once; a page that
// ends exactly at the last snapshot says no page follows; a cursor goes on after its place
// even when its snapshot was deleted; bad cursors and page sizes are INVALID_ARGUMENT; another
// tenant sees none of them.
func TestSnapshotPages(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	a, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var all, ofA []string // newest first
	for i := range 5 {
		id := a.ID
		if i%2 == 1 {
			id = b.ID
		}
		snap := mustSnapshot(t, e, id)
		all = append([]string{snap.ID}, all...)
		if id == a.ID {
			ofA = append([]string{snap.ID}, ofA...)
		}
	}
	for _, tc := range []struct {
		name    string
		sandbox string
		limit   int
		want    []string
		sizes   []int
	}{
		{"project-by-2", "", 2, all, []int{2, 2, 1}},
		{"project-exact-fill", "", 5, all, []int{5}},
		{"project-by-1", "", 1, all, []int{1, 1, 1, 1, 1}},
		{"sandbox-by-2", a.ID, 2, ofA, []int{2, 1}},
		{"sandbox-exact-fill", a.ID, 3, ofA, []int{3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids, sizes := pageAll(t, e, tc.sandbox, tc.limit)
			if !slices.Equal(ids, tc.want) || !slices.Equal(sizes, tc.sizes) {
				t.Errorf("got %v in pages %v, want %v in pages %v", ids, sizes, tc.want, tc.sizes)
			}
		})
	}

	// A cursor whose snapshot is deleted still goes on after its place.
	first, err := e.Svc.SnapshotPage(ctx, alice, "", SnapshotListOptions{Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Svc.DeleteSnapshot(ctx, alice, first.Snapshots[1].ID); err != nil {
		t.Fatal(err)
	}
	rest, err := e.Svc.SnapshotPage(ctx, alice, "", SnapshotListOptions{Limit: 10, After: first.NextCursor})
	if err != nil || !slices.Equal(snapshotIDs(rest.Snapshots), all[2:]) || rest.NextCursor != "" {
		t.Errorf("after a deleted snapshot's cursor: got %v next %q (%v), want %v and no next page", snapshotIDs(rest.Snapshots), rest.NextCursor, err, all[2:])
	}

	for _, tc := range []struct {
		name string
		opts SnapshotListOptions
	}{
		{"page-too-large", SnapshotListOptions{Limit: 100000}},
		{"junk-cursor", SnapshotListOptions{After: "nope"}},
		{"not-a-snapshot", SnapshotListOptions{After: "123.sbx_01HXXXXXXXXXXXXXXXXXXXXXXX"}},
		{"negative-time", SnapshotListOptions{After: "-5.snap_x"}},
		{"oversize-cursor", SnapshotListOptions{After: "1.snap_" + string(make([]byte, 200))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := e.Svc.SnapshotPage(ctx, alice, "", tc.opts); apierror.CodeOf(err) != apierror.InvalidArgument {
				t.Errorf("got %v, want INVALID_ARGUMENT", err)
			}
		})
	}

	// Another tenant: alice's sandbox does not exist, its project lists nothing.
	if _, err := e.Svc.SnapshotPage(ctx, bob, a.ID, SnapshotListOptions{}); apierror.CodeOf(err) != apierror.NotFound {
		t.Errorf("bob's page of alice's sandbox: got %v, want NOT_FOUND", err)
	}
	if page, err := e.Svc.SnapshotPage(ctx, bob, "", SnapshotListOptions{After: first.NextCursor}); err != nil || len(page.Snapshots) != 0 {
		t.Errorf("bob's project after alice's cursor: got %v (%v), want none", snapshotIDs(page.Snapshots), err)
	}
}
