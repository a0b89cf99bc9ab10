package tests

import (
	"net/http"
	"regexp"
	"testing"
	"time"
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
func (s *Server) listSnapshots(t *testing.T, id string, headers ...string) snapshotListJSON {
	t.Helper()
	path := prefix + "/snapshots"
	if id != "" {
		path = prefix + "/" + id + "/snapshots"
	}
	r := s.curl(t, http.MethodGet, path, nil, headers...)
	r.want(t, http.StatusOK)
	var l snapshotListJSON
	r.decode(t, &l)
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
	s := startServer(t, serverOptions{Extra: map[string]any{
		"quota":       map[string]any{"default_limit": 0},
		"checkpoints": map[string]any{"keep_last": 5},
	}})
	key := hdrTenant1
	sb := s.create(t, `{"profile":"sandboxes-default"}`, key)
	id := sb.SandboxID
	s.run(t, id, []string{"bash", "-c", "mkdir -p src && echo before > src/first.txt && ln -s src/first.txt link"}, key)

	var snap snapshotJSON
	step(t, "snapshot-while-running", func(t *testing.T) {
		// curl -X POST -H "X-Api-Key: …" $URL/sandbox/sandboxes/v1/$SANDBOX_ID/snapshots
		r := s.curl(t, http.MethodPost, prefix+"/"+id+"/snapshots", nil, key)
		r.want(t, http.StatusCreated)
		r.decode(t, &snap)
		if !snapshotIDPattern.MatchString(snap.SnapshotID) || snap.SandboxID != id || snap.SizeBytes <= 0 ||
			len(snap.SHA256) != 64 || snap.CreatedAt.IsZero() {
			t.Fatalf("%s: got %+v, want a snapshot of %s", r, snap, id)
		}
		got := s.get(t, id, key)
		if got.State != "RUNNING" || got.LatestSnapshotID != snap.SnapshotID {
			t.Fatalf("after snapshot: got %s latest %q, want RUNNING with latest %s", got.State, got.LatestSnapshotID, snap.SnapshotID)
		}
		s.run(t, id, []string{"bash", "-c", "echo after > later.txt"}, key)
		if out := s.run(t, id, []string{"cat", "link", "later.txt"}, key); out != "before\nafter\n" {
			t.Fatalf("exec after snapshot: got %q, want %q", out, "before\nafter\n")
		}
	})

	step(t, "list-rest-and-graphql", func(t *testing.T) {
		if got := s.listSnapshots(t, id, key).ids(); len(got) != 1 || got[0] != snap.SnapshotID {
			t.Errorf("REST list of %s: got %v, want [%s]", id, got, snap.SnapshotID)
		}
		if got := s.listSnapshots(t, "", key).ids(); !containsID(got, snap.SnapshotID) {
			t.Errorf("REST project list: got %v, want %s in it", got, snap.SnapshotID)
		}
		for _, vars := range []map[string]any{{"id": id}, {"id": nil}} {
			var list []struct {
				ID        string `json:"id"`
				SandboxID string `json:"sandboxId"`
				SHA256    string `json:"sha256"`
			}
			s.gql(t, gqlSnapshots, vars, key).ok(t, "snapshots", &list)
			if len(list) != 1 || list[0].ID != snap.SnapshotID || list[0].SandboxID != id || list[0].SHA256 != snap.SHA256 {
				t.Errorf("GraphQL snapshots(%v): got %+v, want [%s]", vars["id"], list, snap.SnapshotID)
			}
		}
	})

	step(t, "tenancy", func(t *testing.T) {
		if got := s.listSnapshots(t, "", hdrTenant2).ids(); len(got) != 0 {
			t.Errorf("another tenant's project list: got %v, want none", got)
		}
		s.curl(t, http.MethodGet, prefix+"/"+id+"/snapshots", nil, hdrTenant2).wantError(t, http.StatusNotFound, "NOT_FOUND")
		s.curl(t, http.MethodPost, prefix+"/"+id+"/snapshots", nil, hdrTenant2).wantError(t, http.StatusNotFound, "NOT_FOUND")
		s.curl(t, http.MethodDelete, prefix+"/snapshots/"+snap.SnapshotID, nil, hdrTenant2).
			wantError(t, http.StatusNotFound, "NOT_FOUND", snap.SnapshotID)
		r := s.curl(t, http.MethodPost, prefix, []byte(`{"source":{"snapshot_id":"`+snap.SnapshotID+`"}}`), hdrJSON, hdrTenant2)
		r.wantError(t, http.StatusNotFound, "NOT_FOUND", snap.SnapshotID)
	})

	var final string
	step(t, "destroy", func(t *testing.T) {
		r := s.curl(t, http.MethodDelete, prefix+"/"+id, nil, key)
		r.want(t, http.StatusOK)
		var destroyed sandboxJSON
		r.decode(t, &destroyed)
		final = destroyed.SnapshotID
		if final == "" || final == snap.SnapshotID {
			t.Fatalf("%s: got final snapshot %q, want a new one", r, final)
		}
		// The destroyed sandbox's snapshots stay, newest first, the final one descending from ours.
		l := s.listSnapshots(t, id, key)
		if got := l.ids(); len(got) != 2 || got[0] != final || got[1] != snap.SnapshotID || l.Snapshots[0].ParentSnapshotID != snap.SnapshotID {
			t.Fatalf("after destroy: got %+v, want [%s %s], the final one with parent %s", l.Snapshots, final, snap.SnapshotID, snap.SnapshotID)
		}
	})

	var restored sandboxJSON
	step(t, "create-from-snapshot", func(t *testing.T) {
		restored = s.create(t, `{"profile":"sandboxes-default","source":{"snapshot_id":"`+snap.SnapshotID+`"}}`, key)
		if restored.SandboxID == id {
			t.Fatalf("got the old sandbox id %s, want a new one", id)
		}
		if out := s.run(t, restored.SandboxID, []string{"cat", "link"}, key); out != "before\n" {
			t.Errorf("file through its link: got %q, want %q", out, "before\n")
		}
		if out := s.run(t, restored.SandboxID, []string{"readlink", "link"}, key); out != "src/first.txt\n" {
			t.Errorf("symlink: got %q, want %q", out, "src/first.txt\n")
		}
		if out := s.run(t, restored.SandboxID, []string{"bash", "-c", "test -e later.txt && echo present || echo absent"}, key); out != "absent\n" {
			t.Errorf("a file written after the snapshot: got %q, want absent", out)
		}
		// Its snapshots descend from the source; this one through GraphQL.
		var gs struct {
			ID               string  `json:"id"`
			ParentSnapshotID *string `json:"parentSnapshotId"`
		}
		s.gql(t, `mutation($id: ID!) { snapshotSandbox(id: $id) { id parentSnapshotId } }`,
			map[string]any{"id": restored.SandboxID}, key).ok(t, "snapshotSandbox", &gs)
		if gs.ParentSnapshotID == nil || *gs.ParentSnapshotID != snap.SnapshotID {
			t.Errorf("snapshotSandbox: got %+v, want parent %s", gs, snap.SnapshotID)
		}
	})

	// Archives and GCS prefixes: TestBootstrapSources (bootstrap_test.go).
	step(t, "source-refusals", func(t *testing.T) {
		r := s.curl(t, http.MethodPost, prefix, []byte(`{"source":{"archive_url":"http://storage.example/task.zip"}}`), hdrJSON, key)
		r.wantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "only https")
		r = s.curl(t, http.MethodPost, prefix, []byte(`{"source":{"snapshot_id":"`+snap.SnapshotID+`","gcs_prefix":"gs://b/p/"}}`), hdrJSON, key)
		r.wantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "exactly one")
		s.gql(t, gqlCreate, map[string]any{"in": map[string]any{"source": map[string]any{"gcsPrefix": "gs://some-bucket/p/"}}}, key).
			wantCode(t, http.StatusOK, "INVALID_ARGUMENT", "not permitted for this project")
	})

	step(t, "delete", func(t *testing.T) {
		r := s.curl(t, http.MethodDelete, prefix+"/snapshots/"+snap.SnapshotID, nil, key)
		r.want(t, http.StatusOK)
		s.curl(t, http.MethodDelete, prefix+"/snapshots/"+snap.SnapshotID, nil, key).wantError(t, http.StatusNotFound, "NOT_FOUND")
		var ok bool
		s.gql(t, `mutation($id: ID!) { deleteSnapshot(id: $id) }`, map[string]any{"id": final}, key).ok(t, "deleteSnapshot", &ok)
		if !ok {
			t.Errorf("deleteSnapshot(%s): got false, want true", final)
		}
		s.curl(t, http.MethodGet, prefix+"/"+id+"/snapshots", nil, key).wantError(t, http.StatusNotFound, "NOT_FOUND")
		// A stopped sandbox's latest snapshot is the only copy of its workspace.
		r = s.curl(t, http.MethodPost, prefix+"/"+restored.SandboxID+"/stop", nil, key)
		r.want(t, http.StatusOK)
		var stopped sandboxJSON
		r.decode(t, &stopped)
		s.curl(t, http.MethodDelete, prefix+"/snapshots/"+stopped.LatestSnapshotID, nil, key).
			wantError(t, http.StatusConflict, "INVALID_STATE", "only copy", stopped.LatestSnapshotID)
		s.curl(t, http.MethodPost, prefix+"/"+restored.SandboxID+"/snapshots", nil, key).
			wantError(t, http.StatusConflict, "INVALID_STATE", "STOPPED")
	})
}
