package resolvers

import (
	"slices"
	"strings"
	"testing"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/sandbox"
)

const snapshotFields = `id sandboxId createdAt sizeBytes rawSizeBytes sha256 parentSnapshotId`

func TestSnapshotSandbox(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	r := e.post(t, apitest.UserKey, `mutation($id: ID!) { snapshotSandbox(id: $id) { snapshot { `+snapshotFields+` } } }`, map[string]any{"id": apitest.SandboxRunning})
	noErrors(t, r)
	var got map[string]any
	field(t, r, "snapshotSandbox.snapshot", &got)
	want := map[string]any{"id": apitest.SnapLatest, "sandboxId": apitest.SandboxRunning, "createdAt": "2025-01-02T03:05:05Z",
		"sizeBytes": float64(5 << 30), "rawSizeBytes": float64(6 << 30), "sha256": strings.Repeat("ab", 32), "parentSnapshotId": apitest.SnapOld}
	for k, v := range want {
		if !equalJSON(got[k], v) {
			t.Errorf("%s: got %v, want %v", k, got[k], v)
		}
	}
	r = e.post(t, apitest.UserKey, `mutation { snapshotSandbox(id: "`+apitest.SandboxBusy+`") { snapshot { id } } }`, nil)
	if r.code(0) != "INVALID_STATE" || r.Errors[0].Extensions["retryAfter"] == nil {
		t.Errorf("busy sandbox: got %+v, want INVALID_STATE with retryAfter", r.Errors)
	}
	r = e.post(t, apitest.UserKey, `mutation { snapshotSandbox(id: "sbx_other") { snapshot { id } } }`, nil)
	if r.code(0) != "NOT_FOUND" {
		t.Errorf("unknown sandbox: got %+v, want NOT_FOUND", r.Errors)
	}
}

func TestSnapshotsQuery(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	tests := []struct {
		name, query string
		wantSandbox string
		wantLimit   int
	}{
		{name: "project-default", query: `{ snapshots { nodes { id parentSnapshotId } } }`, wantLimit: 50},
		{name: "sandbox-first", query: `{ snapshots(sandboxId: "` + apitest.SandboxRunning + `", first: 5) { nodes { id parentSnapshotId } } }`,
			wantSandbox: apitest.SandboxRunning, wantLimit: 5},
		{name: "explicit-null", query: `{ snapshots(sandboxId: null, first: null) { nodes { id parentSnapshotId } } }`, wantLimit: 50},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.post(t, apitest.UserKey, tt.query, nil)
			noErrors(t, r)
			var page struct {
				Nodes []struct {
					ID               string
					ParentSnapshotID *string
				}
			}
			field(t, r, "snapshots", &page)
			got := page.Nodes
			if len(got) != 2 || got[0].ID != apitest.SnapLatest || got[1].ParentSnapshotID != nil {
				t.Errorf("got %+v, want both snapshots in the service's order, the older without a parent", got)
			}
			args := e.fake.Last("SnapshotPage")
			if args.SandboxID != tt.wantSandbox || args.Limit != tt.wantLimit || args.After != "" {
				t.Errorf("got SnapshotPage(%q, %d, %q), want (%q, %d, \"\")", args.SandboxID, args.Limit, args.After, tt.wantSandbox, tt.wantLimit)
			}
		})
	}
	r := e.post(t, apitest.UserKey, `{ snapshots(first: 0) { nodes { id } } }`, nil)
	if r.code(0) != "INVALID_ARGUMENT" || r.Errors[0].Extensions["field"] != "first" {
		t.Errorf("first 0: got %+v, want INVALID_ARGUMENT on first", r.Errors)
	}
	r = e.post(t, apitest.UserKey, `{ snapshots(sandboxId: "sbx_other") { nodes { id } } }`, nil)
	if r.code(0) != "NOT_FOUND" {
		t.Errorf("unknown sandbox: got %+v, want NOT_FOUND", r.Errors)
	}
}

// connPage is a page of a connection as it travels.
type connPage struct {
	Edges []struct {
		Cursor string
		Node   struct{ ID string }
	}
	PageInfo struct {
		HasNextPage, HasPreviousPage bool
		StartCursor, EndCursor       *string
	}
}

const pageSelection = `edges { cursor node { id } } pageInfo { hasNextPage hasPreviousPage startCursor endCursor }`

// checkPages reads a connection one item per page after a cursor (vars's "after") and wants
// the ids in order, each page's cursors its edge's, and hasNextPage true on all but the last.
func checkPages(t *testing.T, e *env, query, name string, vars map[string]any, want []string) {
	t.Helper()
	var got []string
	after := any(nil)
	for i := range len(want) + 1 {
		vars["after"] = after
		r := e.post(t, apitest.UserKey, query, vars)
		noErrors(t, r)
		var page connPage
		field(t, r, name, &page)
		if len(page.Edges) != 1 {
			t.Fatalf("page %d: got %d edges, want 1", i, len(page.Edges))
		}
		edge := page.Edges[0]
		got = append(got, edge.Node.ID)
		pi := page.PageInfo
		if pi.StartCursor == nil || pi.EndCursor == nil || *pi.StartCursor != edge.Cursor || *pi.EndCursor != edge.Cursor || pi.HasPreviousPage {
			t.Fatalf("page %d: got page info %+v for cursor %q, want start and end that cursor", i, pi, edge.Cursor)
		}
		if last := len(got) == len(want); pi.HasNextPage == last {
			t.Fatalf("page %d: got hasNextPage %v, want %v", i, pi.HasNextPage, !last)
		}
		if !pi.HasNextPage {
			break
		}
		after = *pi.EndCursor
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestSnapshotsPages: snapshots is a connection: pages after a cursor, hasNextPage false on
// the last (also when it fills exactly), a malformed cursor and an oversized first refused
// with INVALID_ARGUMENT on their argument.
func TestSnapshotsPages(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	q := `query($first: Int, $after: String) { snapshots(first: $first, after: $after) { ` + pageSelection + ` } }`
	checkPages(t, e, q, "snapshots", map[string]any{"first": 1}, []string{apitest.SnapLatest, apitest.SnapOld})
	r := e.post(t, apitest.UserKey, q, map[string]any{"first": 2})
	var page connPage
	field(t, r, "snapshots", &page)
	if len(page.Edges) != 2 || page.PageInfo.HasNextPage {
		t.Errorf("a page that fills exactly: got %+v, want both and no next page", page)
	}
	for _, tc := range []struct {
		name  string
		vars  map[string]any
		field string
	}{
		{"bad-cursor", map[string]any{"after": "snap_nope"}, "after"},
		{"first-over-the-bound", map[string]any{"first": apitest.MaxPage + 1}, "first"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.post(t, apitest.UserKey, q, tc.vars)
			if r.code(0) != "INVALID_ARGUMENT" || r.Errors[0].Extensions["field"] != tc.field || string(r.Data["snapshots"]) != "null" {
				t.Errorf("got %+v %s, want INVALID_ARGUMENT on %s and null", r.Errors, r.Data["snapshots"], tc.field)
			}
		})
	}
}

func TestDeleteSnapshot(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	r := e.post(t, apitest.UserKey, `mutation($id: ID!) { deleteSnapshot(id: $id) { deletedSnapshotId } }`, map[string]any{"id": apitest.SnapOld})
	noErrors(t, r)
	var payload struct{ DeletedSnapshotID string }
	field(t, r, "deleteSnapshot", &payload)
	deleted := e.fake.Last("DeleteSnapshot").ID
	if payload.DeletedSnapshotID != apitest.SnapOld || deleted != apitest.SnapOld {
		t.Errorf("got %+v, deleted %q, want %s both", payload, deleted, apitest.SnapOld)
	}
	r = e.post(t, apitest.UserKey, `mutation { deleteSnapshot(id: "`+apitest.SnapLatest+`") { deletedSnapshotId } }`, nil)
	if r.code(0) != "INVALID_STATE" || r.Errors[0].Extensions["state"] != "STOPPED" {
		t.Errorf("latest of a stopped sandbox: got %+v, want INVALID_STATE with the state", r.Errors)
	}
	r = e.post(t, apitest.UserKey, `mutation { deleteSnapshot(id: "snap_nope") { deletedSnapshotId } }`, nil)
	if r.code(0) != "NOT_FOUND" {
		t.Errorf("unknown snapshot: got %+v, want NOT_FOUND", r.Errors)
	}
}

func TestCreateSandboxWithSource(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	tests := []struct {
		name, input string
		want        *sandbox.Source
	}{
		{name: "none", input: `{}`},
		{name: "null", input: `{source: null}`},
		{name: "snapshot", input: `{source: {snapshotId: "` + apitest.SnapOld + `"}}`, want: &sandbox.Source{SnapshotID: apitest.SnapOld}},
		// The service decides what is supported and that exactly one is set.
		{name: "archive", input: `{source: {archiveUrl: "https://storage.example/task.zip"}}`,
			want: &sandbox.Source{ArchiveURL: "https://storage.example/task.zip"}},
		{name: "gcs-and-snapshot", input: `{source: {gcsPrefix: "gs://b/p/", snapshotId: "` + apitest.SnapOld + `"}}`,
			want: &sandbox.Source{GCSPrefix: "gs://b/p/", SnapshotID: apitest.SnapOld}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.post(t, apitest.UserKey, `mutation { createSandbox(input: `+tt.input+`) { sandbox { id } } }`, nil)
			noErrors(t, r)
			got := e.fake.Last("Create").Create.Source
			if (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
				t.Errorf("got source %+v, want %+v", got, tt.want)
			}
		})
	}
}
