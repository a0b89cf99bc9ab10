package resolvers

import (
	"strings"
	"testing"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/sandbox"
)

const snapshotFields = `id sandboxId createdAt sizeBytes rawSizeBytes sha256 parentSnapshotId`

func TestSnapshotSandbox(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	r := e.post(t, apitest.UserKey, `mutation($id: ID!) { snapshotSandbox(id: $id) { `+snapshotFields+` } }`, map[string]any{"id": apitest.SandboxRunning})
	noErrors(t, r)
	var got map[string]any
	field(t, r, "snapshotSandbox", &got)
	want := map[string]any{"id": apitest.SnapLatest, "sandboxId": apitest.SandboxRunning, "createdAt": "2025-01-02T03:05:05Z",
		"sizeBytes": float64(5 << 30), "rawSizeBytes": float64(6 << 30), "sha256": strings.Repeat("ab", 32), "parentSnapshotId": apitest.SnapOld}
	for k, v := range want {
		if !equalJSON(got[k], v) {
			t.Errorf("%s: got %v, want %v", k, got[k], v)
		}
	}
	r = e.post(t, apitest.UserKey, `mutation { snapshotSandbox(id: "`+apitest.SandboxBusy+`") { id } }`, nil)
	if r.code(0) != "INVALID_STATE" || r.Errors[0].Extensions["retryAfter"] == nil {
		t.Errorf("busy sandbox: got %+v, want INVALID_STATE with retryAfter", r.Errors)
	}
	r = e.post(t, apitest.UserKey, `mutation { snapshotSandbox(id: "sbx_other") { id } }`, nil)
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
		{name: "project-default", query: `{ snapshots { id parentSnapshotId } }`, wantLimit: 50},
		{name: "sandbox-first", query: `{ snapshots(sandboxId: "` + apitest.SandboxRunning + `", first: 5) { id parentSnapshotId } }`,
			wantSandbox: apitest.SandboxRunning, wantLimit: 5},
		{name: "explicit-null", query: `{ snapshots(sandboxId: null, first: null) { id parentSnapshotId } }`, wantLimit: 50},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.post(t, apitest.UserKey, tt.query, nil)
			noErrors(t, r)
			var got []struct {
				ID               string
				ParentSnapshotID *string
			}
			field(t, r, "snapshots", &got)
			if len(got) != 2 || got[0].ID != apitest.SnapLatest || got[1].ParentSnapshotID != nil {
				t.Errorf("got %+v, want both snapshots in the service's order, the older without a parent", got)
			}
			args := e.fake.Last("ListSnapshots")
			if args.SandboxID != tt.wantSandbox || args.Limit != tt.wantLimit {
				t.Errorf("got ListSnapshots(%q, %d), want (%q, %d)", args.SandboxID, args.Limit, tt.wantSandbox, tt.wantLimit)
			}
		})
	}
	r := e.post(t, apitest.UserKey, `{ snapshots(first: 0) { id } }`, nil)
	if r.code(0) != "INVALID_ARGUMENT" || r.Errors[0].Extensions["field"] != "first" {
		t.Errorf("first 0: got %+v, want INVALID_ARGUMENT on first", r.Errors)
	}
	r = e.post(t, apitest.UserKey, `{ snapshots(sandboxId: "sbx_other") { id } }`, nil)
	if r.code(0) != "NOT_FOUND" {
		t.Errorf("unknown sandbox: got %+v, want NOT_FOUND", r.Errors)
	}
}

func TestDeleteSnapshot(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	r := e.post(t, apitest.UserKey, `mutation($id: ID!) { deleteSnapshot(id: $id) }`, map[string]any{"id": apitest.SnapOld})
	noErrors(t, r)
	var ok bool
	field(t, r, "deleteSnapshot", &ok)
	deleted := e.fake.Last("DeleteSnapshot").ID
	if !ok || deleted != apitest.SnapOld {
		t.Errorf("got %v, deleted %q, want true and %s", ok, deleted, apitest.SnapOld)
	}
	r = e.post(t, apitest.UserKey, `mutation { deleteSnapshot(id: "`+apitest.SnapLatest+`") }`, nil)
	if r.code(0) != "INVALID_STATE" || r.Errors[0].Extensions["state"] != "STOPPED" {
		t.Errorf("latest of a stopped sandbox: got %+v, want INVALID_STATE with the state", r.Errors)
	}
	r = e.post(t, apitest.UserKey, `mutation { deleteSnapshot(id: "snap_nope") }`, nil)
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
			r := e.post(t, apitest.UserKey, `mutation { createSandbox(input: `+tt.input+`) { id } }`, nil)
			noErrors(t, r)
			got := e.fake.Last("Create").Create.Source
			if (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
				t.Errorf("got source %+v, want %+v", got, tt.want)
			}
		})
	}
}
