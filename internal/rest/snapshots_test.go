package rest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/apierror"
	"sandboxd/internal/sandbox"
)

// snapshotFake answers the fixture snapshots' ids with values of its own.
func snapshotFake() *apitest.Fake {
	f := apitest.New()
	f.Snapshots = []sandbox.SnapshotInfo{
		{ID: apitest.SnapLatest, SandboxID: apitest.SandboxRunning, CreatedAt: t1, SizeBytes: 1234, RawSizeBytes: 10240, SHA256: strings.Repeat("ab", 32),
			Parent: apitest.SnapOld},
		{ID: apitest.SnapOld, SandboxID: apitest.SandboxRunning, CreatedAt: apitest.T0, SizeBytes: 1000, RawSizeBytes: 10240,
			SHA256: strings.Repeat("cd", 32)},
	}
	return f
}

// lastSnapshotCall is the fake's last snapshot call: "Snapshot sbx_…", "ListSnapshots sbx_… 10",
// "DeleteSnapshot snap_…"; "" when there was none.
func lastSnapshotCall(f *apitest.Fake) string {
	last := ""
	for _, c := range f.Calls() {
		switch c.Method {
		case "Snapshot":
			last = "Snapshot " + c.SandboxID
		case "ListSnapshots":
			last = fmt.Sprintf("ListSnapshots %s %d", c.SandboxID, c.Limit)
		case "DeleteSnapshot":
			last = "DeleteSnapshot " + c.ID
		}
	}
	return last
}

func TestSnapshotCreate(t *testing.T) {
	f := snapshotFake()
	h := newTestHandler(t, f)
	for _, body := range []string{"", "{}"} {
		rec := serve(t, h, http.MethodPost, Prefix+"/"+apitest.SandboxRunning+"/snapshots", body)
		if rec.Code != http.StatusCreated {
			t.Fatalf("body %q: got %d %s, want 201", body, rec.Code, rec.Body)
		}
		m := decodeObject(t, rec.Body.Bytes())
		want := map[string]any{"snapshot_id": apitest.SnapLatest, "sandbox_id": apitest.SandboxRunning, "created_at": "2025-01-02T03:04:05.054Z",
			"size_bytes": 1234.0, "raw_size_bytes": 10240.0, "sha256": strings.Repeat("ab", 32),
			"parent_snapshot_id": apitest.SnapOld}
		for k, v := range want {
			if m[k] != v {
				t.Errorf("%s: got %v, want %v", k, m[k], v)
			}
		}
		if got := lastSnapshotCall(f); got != "Snapshot "+apitest.SandboxRunning {
			t.Errorf("got call %q, want Snapshot %s", got, apitest.SandboxRunning)
		}
	}
	rec := serve(t, h, http.MethodPost, Prefix+"/"+apitest.SandboxRunning+"/snapshots", `{"name":"x"}`)
	if rec.Code != http.StatusBadRequest {
		t.Errorf("a body: got %d, want 400", rec.Code)
	}
	f.SnapshotErr = sandbox.Check(sandbox.Stopped, sandbox.VerbSnapshot, apitest.SandboxRunning)
	rec = serve(t, h, http.MethodPost, Prefix+"/"+apitest.SandboxRunning+"/snapshots", "")
	if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), `"state":"STOPPED"`) {
		t.Errorf("stopped: got %d %s, want 409 with the state", rec.Code, rec.Body)
	}
}

func TestSnapshotList(t *testing.T) {
	f := snapshotFake()
	h := newTestHandler(t, f)
	tests := []struct {
		name, path string
		wantCall   string
	}{
		// /snapshots must not be taken for a sandbox id by GET …/{id}.
		{name: "project", path: Prefix + "/snapshots", wantCall: "ListSnapshots  0"},
		{name: "project-limit", path: Prefix + "/snapshots?limit=7", wantCall: "ListSnapshots  7"},
		{name: "sandbox", path: Prefix + "/" + apitest.SandboxRunning + "/snapshots", wantCall: "ListSnapshots " + apitest.SandboxRunning + " 0"},
		{name: "sandbox-limit", path: Prefix + "/" + apitest.SandboxRunning + "/snapshots?limit=3", wantCall: "ListSnapshots " + apitest.SandboxRunning + " 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := serve(t, h, http.MethodGet, tt.path, "")
			if rec.Code != http.StatusOK {
				t.Fatalf("got %d %s, want 200", rec.Code, rec.Body)
			}
			var out struct {
				Snapshots []map[string]any `json:"snapshots"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
				t.Fatal(err)
			}
			if len(out.Snapshots) != 2 || out.Snapshots[0]["snapshot_id"] != apitest.SnapLatest {
				t.Fatalf("got %v, want both snapshots in the service's order", out.Snapshots)
			}
			if _, ok := out.Snapshots[1]["parent_snapshot_id"]; ok {
				t.Errorf("got parent_snapshot_id %v, want it absent", out.Snapshots[1]["parent_snapshot_id"])
			}
			if got := lastSnapshotCall(f); got != tt.wantCall {
				t.Errorf("got call %q, want %q", got, tt.wantCall)
			}
		})
	}
	for _, bad := range []string{"0", "-1", "x"} {
		if rec := serve(t, h, http.MethodGet, Prefix+"/snapshots?limit="+bad, ""); rec.Code != http.StatusBadRequest {
			t.Errorf("limit=%s: got %d, want 400", bad, rec.Code)
		}
	}
	f.Snapshots = nil
	rec := serve(t, h, http.MethodGet, Prefix+"/snapshots", "")
	if rec.Code != http.StatusOK || strings.TrimSpace(rec.Body.String()) != `{"snapshots":[]}` {
		t.Errorf("none: got %d %s, want an empty list", rec.Code, rec.Body)
	}
	f.SnapshotErr = apierror.New(apierror.NotFound, "sandbox %s not found", apitest.SandboxRunning)
	if rec := serve(t, h, http.MethodGet, Prefix+"/"+apitest.SandboxRunning+"/snapshots", ""); rec.Code != http.StatusNotFound {
		t.Errorf("unknown sandbox: got %d, want 404", rec.Code)
	}
}

func TestSnapshotDelete(t *testing.T) {
	f := snapshotFake()
	h := newTestHandler(t, f)
	rec := serve(t, h, http.MethodDelete, Prefix+"/snapshots/"+apitest.SnapOld, "")
	if rec.Code != http.StatusOK {
		t.Fatalf("got %d %s, want 200", rec.Code, rec.Body)
	}
	if m := decodeObject(t, rec.Body.Bytes()); m["snapshot_id"] != apitest.SnapOld || m["deleted"] != true {
		t.Errorf("got %v, want snapshot_id and deleted true", m)
	}
	if got := lastSnapshotCall(f); got != "DeleteSnapshot "+apitest.SnapOld {
		t.Errorf("got call %q, want DeleteSnapshot %s", got, apitest.SnapOld)
	}
	f.SnapshotErr = apierror.New(apierror.InvalidState, "cannot delete snapshot %s: it is the only copy", apitest.SnapOld)
	if rec := serve(t, h, http.MethodDelete, Prefix+"/snapshots/"+apitest.SnapOld, ""); rec.Code != http.StatusConflict {
		t.Errorf("latest of a stopped sandbox: got %d, want 409", rec.Code)
	}
	f.SnapshotErr = apierror.New(apierror.NotFound, "snapshot %s not found", apitest.SnapOld)
	if rec := serve(t, h, http.MethodDelete, Prefix+"/snapshots/"+apitest.SnapOld, ""); rec.Code != http.StatusNotFound {
		t.Errorf("missing: got %d, want 404", rec.Code)
	}
}

func TestCreateWithSource(t *testing.T) {
	f := apitest.New()
	h := newTestHandler(t, f)
	tests := []struct {
		name, body string
		want       *sandbox.Source
	}{
		{name: "none", body: `{"profile":"p"}`},
		{name: "null", body: `{"source":null}`},
		{name: "snapshot", body: `{"source":{"snapshot_id":"` + apitest.SnapLatest + `"}}`, want: &sandbox.Source{SnapshotID: apitest.SnapLatest}},
		// The service decides what it supports; the handler passes every documented field on.
		{name: "archive", body: `{"source":{"archive_url":"https://storage.example/task.zip"}}`,
			want: &sandbox.Source{ArchiveURL: "https://storage.example/task.zip"}},
		{name: "gcs", body: `{"source":{"gcs_prefix":"gs://b/p/"}}`, want: &sandbox.Source{GCSPrefix: "gs://b/p/"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := serve(t, h, http.MethodPost, Prefix, tt.body)
			if rec.Code != http.StatusCreated {
				t.Fatalf("got %d %s, want 201", rec.Code, rec.Body)
			}
			got := f.CallsTo("Create")[i].Create.Source
			if (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
				t.Fatalf("got source %+v, want %+v", got, tt.want)
			}
		})
	}
	rec := serve(t, h, http.MethodPost, Prefix, `{"source":{"snapshot":"x"}}`)
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "snapshot") {
		t.Errorf("unknown source field: got %d %s, want 400 naming it", rec.Code, rec.Body)
	}
}
