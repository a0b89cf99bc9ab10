package tests

import (
	"net/http"
	"regexp"
	"testing"
	"time"

	"sandboxd/tests/e2e"
)

// snapshotJSON is a snapshot in REST answers.
type snapshotJSON struct {
	SnapshotID       string    `json:"snapshot_id"`
	SandboxID        string    `json:"sandbox_id"`
	CreatedAt        time.Time `json:"created_at"`
	SizeBytes        int64     `json:"size_bytes"`
	RawSizeBytes     int64     `json:"raw_size_bytes"`
	SHA256           string    `json:"sha256"`
	ParentSnapshotID string    `json:"parent_snapshot_id"`
}

type snapshotListJSON struct {
	Snapshots []snapshotJSON `json:"snapshots"`
}

func (l snapshotListJSON) ids() []string {
	out := []string{}
	for _, s := range l.Snapshots {
		out = append(out, s.SnapshotID)
	}
	return out
}

var snapshotIDPattern = regexp.MustCompile(`^snap_[0-9A-HJKMNP-TV-Z]{26}_[0-9]{10}$`)

const gqlSnapshots = `query($id: ID) { snapshots(sandboxId: $id) { id sandboxId createdAt sizeBytes sha256 parentSnapshotId } }`

// listSnapshots lists snapshots through REST: of one sandbox, or of the project when id is "".
func listSnapshots(t *testing.T, s *e2e.Server, id string, headers ...string) snapshotListJSON {
	t.Helper()
	path := e2e.Prefix + "/snapshots"
	if id != "" {
		path = e2e.Prefix + "/" + id + "/snapshots"
	}
	r := s.Curl(t, http.MethodGet, path, nil, headers...)
	r.Want(t, http.StatusOK)
	var l snapshotListJSON
	r.Decode(t, &l)
	return l
}

func containsID(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestSnapshots: snapshot a running sandbox (it keeps running), list snapshots through REST and
// GraphQL, destroy the sandbox, create a new one from the snapshot (the files from before the
// snapshot are there, the later ones are not), delete snapshots; tenancy and the refusals.
func TestSnapshots(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{Extra: map[string]any{
		"quota":       map[string]any{"default_limit": 0},
		"checkpoints": map[string]any{"keep_last": 5},
	}})
	key := e2e.HdrTenant1
	sb := s.Create(t, `{"profile":"sandboxes-default"}`, key)
	id := sb.SandboxID
	s.Run(t, id, []string{"bash", "-c", "mkdir -p src && echo before > src/first.txt && ln -s src/first.txt link"}, key)

	var snap snapshotJSON
	e2e.Step(t, "snapshot-while-running", func(t *testing.T) {
		// curl -X POST -H "X-Api-Key: …" $URL/sandbox/sandboxes/v1/$SANDBOX_ID/snapshots
		r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/snapshots", nil, key)
		r.Want(t, http.StatusCreated)
		r.Decode(t, &snap)
		if !snapshotIDPattern.MatchString(snap.SnapshotID) || snap.SandboxID != id || snap.SizeBytes <= 0 ||
			len(snap.SHA256) != 64 || snap.CreatedAt.IsZero() {
			t.Fatalf("%s: got %+v, want a snapshot of %s", r, snap, id)
		}
		got := s.Get(t, id, key)
		if got.State != "RUNNING" || got.LatestSnapshotID != snap.SnapshotID {
			t.Fatalf("after snapshot: got %s latest %q, want RUNNING with latest %s", got.State, got.LatestSnapshotID, snap.SnapshotID)
		}
		s.Run(t, id, []string{"bash", "-c", "echo after > later.txt"}, key)
		if out := s.Run(t, id, []string{"cat", "link", "later.txt"}, key); out != "before\nafter\n" {
			t.Fatalf("exec after snapshot: got %q, want %q", out, "before\nafter\n")
		}
	})

	e2e.Step(t, "list-rest-and-graphql", func(t *testing.T) {
		if got := listSnapshots(t, s, id, key).ids(); len(got) != 1 || got[0] != snap.SnapshotID {
			t.Errorf("REST list of %s: got %v, want [%s]", id, got, snap.SnapshotID)
		}
		if got := listSnapshots(t, s, "", key).ids(); !containsID(got, snap.SnapshotID) {
			t.Errorf("REST project list: got %v, want %s in it", got, snap.SnapshotID)
		}
		for _, vars := range []map[string]any{{"id": id}, {"id": nil}} {
			var list []struct {
				ID        string `json:"id"`
				SandboxID string `json:"sandboxId"`
				SHA256    string `json:"sha256"`
			}
			s.GQL(t, gqlSnapshots, vars, key).OK(t, "snapshots", &list)
			if len(list) != 1 || list[0].ID != snap.SnapshotID || list[0].SandboxID != id || list[0].SHA256 != snap.SHA256 {
				t.Errorf("GraphQL snapshots(%v): got %+v, want [%s]", vars["id"], list, snap.SnapshotID)
			}
		}
	})

	e2e.Step(t, "tenancy", func(t *testing.T) {
		if got := listSnapshots(t, s, "", e2e.HdrTenant2).ids(); len(got) != 0 {
			t.Errorf("another tenant's project list: got %v, want none", got)
		}
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/snapshots", nil, e2e.HdrTenant2).WantError(t, http.StatusNotFound, "NOT_FOUND")
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/snapshots", nil, e2e.HdrTenant2).WantError(t, http.StatusNotFound, "NOT_FOUND")
		s.Curl(t, http.MethodDelete, e2e.Prefix+"/snapshots/"+snap.SnapshotID, nil, e2e.HdrTenant2).
			WantError(t, http.StatusNotFound, "NOT_FOUND", snap.SnapshotID)
		r := s.Curl(t, http.MethodPost, e2e.Prefix, []byte(`{"source":{"snapshot_id":"`+snap.SnapshotID+`"}}`), e2e.HdrJSON, e2e.HdrTenant2)
		r.WantError(t, http.StatusNotFound, "NOT_FOUND", snap.SnapshotID)
	})

	var final string
	e2e.Step(t, "destroy", func(t *testing.T) {
		r := s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+id, nil, key)
		r.Want(t, http.StatusOK)
		var destroyed e2e.SandboxJSON
		r.Decode(t, &destroyed)
		final = destroyed.SnapshotID
		if final == "" || final == snap.SnapshotID {
			t.Fatalf("%s: got final snapshot %q, want a new one", r, final)
		}
		// The destroyed sandbox's snapshots stay, newest first, the final one descending from ours.
		l := listSnapshots(t, s, id, key)
		if got := l.ids(); len(got) != 2 || got[0] != final || got[1] != snap.SnapshotID || l.Snapshots[0].ParentSnapshotID != snap.SnapshotID {
			t.Fatalf("after destroy: got %+v, want [%s %s], the final one with parent %s", l.Snapshots, final, snap.SnapshotID, snap.SnapshotID)
		}
	})

	var restored e2e.SandboxJSON
	e2e.Step(t, "create-from-snapshot", func(t *testing.T) {
		restored = s.Create(t, `{"profile":"sandboxes-default","source":{"snapshot_id":"`+snap.SnapshotID+`"}}`, key)
		if restored.SandboxID == id {
			t.Fatalf("got the old sandbox id %s, want a new one", id)
		}
		if out := s.Run(t, restored.SandboxID, []string{"cat", "link"}, key); out != "before\n" {
			t.Errorf("file through its link: got %q, want %q", out, "before\n")
		}
		if out := s.Run(t, restored.SandboxID, []string{"readlink", "link"}, key); out != "src/first.txt\n" {
			t.Errorf("symlink: got %q, want %q", out, "src/first.txt\n")
		}
		if out := s.Run(t, restored.SandboxID, []string{"bash", "-c", "test -e later.txt && echo present || echo absent"}, key); out != "absent\n" {
			t.Errorf("a file written after the snapshot: got %q, want absent", out)
		}
		// Its snapshots descend from the source; this one through GraphQL.
		var gs struct {
			ID               string  `json:"id"`
			ParentSnapshotID *string `json:"parentSnapshotId"`
		}
		s.GQL(t, `mutation($id: ID!) { snapshotSandbox(id: $id) { id parentSnapshotId } }`,
			map[string]any{"id": restored.SandboxID}, key).OK(t, "snapshotSandbox", &gs)
		if gs.ParentSnapshotID == nil || *gs.ParentSnapshotID != snap.SnapshotID {
			t.Errorf("snapshotSandbox: got %+v, want parent %s", gs, snap.SnapshotID)
		}
	})

	// Archives and GCS prefixes: TestBootstrapSources (bootstrap_test.go).
	e2e.Step(t, "source-refusals", func(t *testing.T) {
		r := s.Curl(t, http.MethodPost, e2e.Prefix, []byte(`{"source":{"archive_url":"http://storage.example/task.zip"}}`), e2e.HdrJSON, key)
		r.WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "only https")
		r = s.Curl(t, http.MethodPost, e2e.Prefix, []byte(`{"source":{"snapshot_id":"`+snap.SnapshotID+`","gcs_prefix":"gs://b/p/"}}`), e2e.HdrJSON, key)
		r.WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "exactly one")
		s.GQL(t, gqlCreate, map[string]any{"in": map[string]any{"source": map[string]any{"gcsPrefix": "gs://some-bucket/p/"}}}, key).
			WantCode(t, http.StatusOK, "INVALID_ARGUMENT", "not permitted for this project")
	})

	e2e.Step(t, "delete", func(t *testing.T) {
		r := s.Curl(t, http.MethodDelete, e2e.Prefix+"/snapshots/"+snap.SnapshotID, nil, key)
		r.Want(t, http.StatusOK)
		s.Curl(t, http.MethodDelete, e2e.Prefix+"/snapshots/"+snap.SnapshotID, nil, key).WantError(t, http.StatusNotFound, "NOT_FOUND")
		var ok bool
		s.GQL(t, `mutation($id: ID!) { deleteSnapshot(id: $id) }`, map[string]any{"id": final}, key).OK(t, "deleteSnapshot", &ok)
		if !ok {
			t.Errorf("deleteSnapshot(%s): got false, want true", final)
		}
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/snapshots", nil, key).WantError(t, http.StatusNotFound, "NOT_FOUND")
		// A stopped sandbox's latest snapshot is the only copy of its workspace.
		r = s.Curl(t, http.MethodPost, e2e.Prefix+"/"+restored.SandboxID+"/stop", nil, key)
		r.Want(t, http.StatusOK)
		var stopped e2e.SandboxJSON
		r.Decode(t, &stopped)
		s.Curl(t, http.MethodDelete, e2e.Prefix+"/snapshots/"+stopped.LatestSnapshotID, nil, key).
			WantError(t, http.StatusConflict, "INVALID_STATE", "only copy", stopped.LatestSnapshotID)
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+restored.SandboxID+"/snapshots", nil, key).
			WantError(t, http.StatusConflict, "INVALID_STATE", "STOPPED")
	})
}
