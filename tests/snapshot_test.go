package tests

import (
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"sandboxd/client"
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

const gqlSnapshots = `query($id: ID) { snapshots(sandboxId: $id) { nodes { id sandboxId createdAt sizeBytes sha256 parentSnapshotId } } }`

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

// TestSnapshots: snapshot a running sandbox (it keeps running), list snapshots through REST and
// GraphQL, destroy the sandbox, create a new one from the snapshot (the files from before the
// snapshot are there, the later ones are not), delete snapshots; tenancy and the refusals.
func TestSnapshots(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{Extra: map[string]any{
		"quota":       map[string]any{"default_limit": 0},
		"checkpoints": map[string]any{"keep_last": 5},
	}})
	key := e2e.HdrTenant1
	ctx := t.Context()
	c, other := s.Client(client.WithAPIKey(e2e.KeyTenant1)), s.Client(client.WithAPIKey(e2e.KeyTenant2))
	id := newSandbox(ctx, t, s, c, client.CreateRequest{Profile: "sandboxes-default"}, key).ID
	runVia(ctx, t, c, id, []string{"bash", "-c", "mkdir -p src && echo before > src/first.txt && ln -s src/first.txt link"})

	var snap snapshotJSON
	e2e.Step(t, "snapshot-while-running", func(t *testing.T) {
		// The document's curl, kept on the harness: its 201 is the wire's, which the client hides.
		// curl -X POST -H "X-Api-Key: …" $URL/sandbox/sandboxes/v1/$SANDBOX_ID/snapshots
		r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/snapshots", nil, key)
		r.Want(t, http.StatusCreated)
		r.Decode(t, &snap)
		if !snapshotIDPattern.MatchString(snap.SnapshotID) || snap.SandboxID != id || snap.SizeBytes <= 0 ||
			len(snap.SHA256) != 64 || snap.CreatedAt.IsZero() {
			t.Fatalf("%s: got %+v, want a snapshot of %s", r, snap, id)
		}
		got, err := c.Get(ctx, id)
		if err != nil || got.State != client.StateRunning || got.LatestSnapshotID != snap.SnapshotID {
			t.Fatalf("after snapshot: got %s latest %q (%v), want RUNNING with latest %s", got.State, got.LatestSnapshotID, err, snap.SnapshotID)
		}
		runVia(ctx, t, c, id, []string{"bash", "-c", "echo after > later.txt"})
		if out := runVia(ctx, t, c, id, []string{"cat", "link", "later.txt"}); out != "before\nafter\n" {
			t.Fatalf("exec after snapshot: got %q, want %q", out, "before\nafter\n")
		}
	})

	e2e.Step(t, "list-rest-and-graphql", func(t *testing.T) {
		if got, err := c.Snapshots(ctx, id, 0); err != nil || len(got) != 1 || got[0].ID != snap.SnapshotID {
			t.Errorf("REST list of %s: got %v (%v), want [%s]", id, snapshotIDs(got), err, snap.SnapshotID)
		}
		if got, err := c.Snapshots(ctx, "", 0); err != nil || !slices.Contains(snapshotIDs(got), snap.SnapshotID) {
			t.Errorf("REST project list: got %v (%v), want %s in it", snapshotIDs(got), err, snap.SnapshotID)
		}
		for _, vars := range []map[string]any{{"id": id}, {"id": nil}} {
			var data struct {
				Snapshots struct {
					Nodes []struct {
						ID        string `json:"id"`
						SandboxID string `json:"sandboxId"`
						SHA256    string `json:"sha256"`
					} `json:"nodes"`
				} `json:"snapshots"`
			}
			if _, err := c.Do(ctx, gqlSnapshots, vars, &data); err != nil {
				t.Fatalf("GraphQL snapshots(%v): %v", vars["id"], err)
			}
			list := data.Snapshots.Nodes
			if len(list) != 1 || list[0].ID != snap.SnapshotID || list[0].SandboxID != id || list[0].SHA256 != snap.SHA256 {
				t.Errorf("GraphQL snapshots(%v): got %+v, want [%s]", vars["id"], list, snap.SnapshotID)
			}
		}
	})

	e2e.Step(t, "tenancy", func(t *testing.T) {
		if got, err := other.Snapshots(ctx, "", 0); err != nil || len(got) != 0 {
			t.Errorf("another tenant's project list: got %v (%v), want none", snapshotIDs(got), err)
		}
		_, err := other.Snapshots(ctx, id, 0)
		wantClientError(t, "another tenant's list of "+id, err, http.StatusNotFound, client.CodeNotFound)
		_, err = other.Snapshot(ctx, id)
		wantClientError(t, "another tenant's snapshot of "+id, err, http.StatusNotFound, client.CodeNotFound)
		err = other.DeleteSnapshot(ctx, snap.SnapshotID)
		wantClientError(t, "another tenant's delete of "+snap.SnapshotID, err, http.StatusNotFound, client.CodeNotFound, snap.SnapshotID)
		_, err = other.Create(ctx, client.CreateRequest{Source: &client.Source{SnapshotID: snap.SnapshotID}})
		wantClientError(t, "another tenant's create from "+snap.SnapshotID, err, http.StatusNotFound, client.CodeNotFound, snap.SnapshotID)
	})

	var final string
	e2e.Step(t, "destroy", func(t *testing.T) {
		destroyed, err := c.Destroy(ctx, id)
		if err != nil {
			t.Fatalf("destroy: %v", err)
		}
		final = destroyed.SnapshotID
		if final == "" || final == snap.SnapshotID {
			t.Fatalf("destroy: got final snapshot %q, want a new one", final)
		}
		// The destroyed sandbox's snapshots stay, newest first, the final one descending from ours.
		l, err := c.Snapshots(ctx, id, 0)
		if got := snapshotIDs(l); err != nil || len(got) != 2 || got[0] != final || got[1] != snap.SnapshotID || l[0].ParentSnapshotID != snap.SnapshotID {
			t.Fatalf("after destroy: got %+v (%v), want [%s %s], the final one with parent %s", l, err, final, snap.SnapshotID, snap.SnapshotID)
		}
	})

	var restored client.Sandbox
	e2e.Step(t, "create-from-snapshot", func(t *testing.T) {
		restored = newSandbox(ctx, t, s, c, client.CreateRequest{Profile: "sandboxes-default", Source: &client.Source{SnapshotID: snap.SnapshotID}}, key)
		if restored.ID == id {
			t.Fatalf("got the old sandbox id %s, want a new one", id)
		}
		if out := runVia(ctx, t, c, restored.ID, []string{"cat", "link"}); out != "before\n" {
			t.Errorf("file through its link: got %q, want %q", out, "before\n")
		}
		if out := runVia(ctx, t, c, restored.ID, []string{"readlink", "link"}); out != "src/first.txt\n" {
			t.Errorf("symlink: got %q, want %q", out, "src/first.txt\n")
		}
		if out := runVia(ctx, t, c, restored.ID, []string{"bash", "-c", "test -e later.txt && echo present || echo absent"}); out != "absent\n" {
			t.Errorf("a file written after the snapshot: got %q, want absent", out)
		}
		// Its snapshots descend from the source; this one through GraphQL.
		var data struct {
			SnapshotSandbox *struct {
				Snapshot struct {
					ID               string  `json:"id"`
					ParentSnapshotID *string `json:"parentSnapshotId"`
				} `json:"snapshot"`
			} `json:"snapshotSandbox"`
		}
		if _, err := c.Do(ctx, `mutation($id: ID!) { snapshotSandbox(id: $id) { snapshot { id parentSnapshotId } } }`,
			map[string]any{"id": restored.ID}, &data); err != nil {
			t.Fatalf("snapshotSandbox: %v", err)
		}
		if gs := data.SnapshotSandbox; gs == nil || gs.Snapshot.ParentSnapshotID == nil || *gs.Snapshot.ParentSnapshotID != snap.SnapshotID {
			t.Errorf("snapshotSandbox: got %+v, want parent %s", gs, snap.SnapshotID)
		}
	})

	e2e.Step(t, "graphql-pages", func(t *testing.T) {
		// The project's snapshots (of the destroyed sandbox and the restored one), one per page:
		// the REST list's order, hasNextPage until the last page.
		all, err := c.Snapshots(ctx, "", 0)
		if err != nil || len(all) < 3 {
			t.Fatalf("REST project list: got %v (%v), want at least 3", snapshotIDs(all), err)
		}
		const q = `query($first: Int, $after: String) { snapshots(first: $first, after: $after) {
			edges { cursor node { id } } pageInfo { hasNextPage endCursor } } }`
		type page struct {
			Edges []struct {
				Cursor string
				Node   struct{ ID string }
			}
			PageInfo struct {
				HasNextPage bool
				EndCursor   *string
			}
		}
		var got []string
		var firstCursor string
		after := any(nil)
		for i := 0; ; i++ {
			var p page
			s.GQL(t, q, map[string]any{"first": 1, "after": after}, key).OK(t, "snapshots", &p)
			if len(p.Edges) != 1 || p.PageInfo.EndCursor == nil || *p.PageInfo.EndCursor != p.Edges[0].Cursor {
				t.Fatalf("page %d: got %+v, want one snapshot and its cursor as endCursor", i, p)
			}
			got = append(got, p.Edges[0].Node.ID)
			if i == 0 {
				firstCursor = p.Edges[0].Cursor
			}
			if !p.PageInfo.HasNextPage {
				break
			}
			if len(got) > len(all) {
				t.Fatalf("got %v pages, more than the %d snapshots", got, len(all))
			}
			after = *p.PageInfo.EndCursor
		}
		if !slices.Equal(got, snapshotIDs(all)) {
			t.Errorf("GraphQL pages: got %v, want the REST list %v", got, snapshotIDs(all))
		}
		var exact page
		s.GQL(t, q, map[string]any{"first": len(all)}, key).OK(t, "snapshots", &exact)
		if len(exact.Edges) != len(all) || exact.PageInfo.HasNextPage {
			t.Errorf("a page that fills exactly: got %d edges, hasNextPage %v, want %d and false", len(exact.Edges), exact.PageInfo.HasNextPage, len(all))
		}
		// Another tenant with tenant 1's cursor gets its own (empty) list, never tenant 1's.
		var theirs page
		s.GQL(t, q, map[string]any{"first": 5, "after": firstCursor}, e2e.HdrTenant2).OK(t, "snapshots", &theirs)
		if len(theirs.Edges) != 0 || theirs.PageInfo.HasNextPage {
			t.Errorf("tenant 2 after tenant 1's cursor: got %+v, want nothing", theirs)
		}
		// Hostile arguments: bounded, with a stable code.
		s.GQL(t, q, map[string]any{"first": 501}, key).WantCode(t, http.StatusOK, "INVALID_ARGUMENT")
		if g := s.GQL(t, q, map[string]any{"first": 1 << 30}, key); len(g.Errors) == 0 || g.Errors[0].Code() != "COST_EXCEEDED" {
			t.Errorf("first 2^30: got %s, want COST_EXCEEDED before anything runs", g)
		}
		s.GQL(t, q, map[string]any{"after": strings.Repeat("9", 5000)}, key).WantCode(t, http.StatusOK, "INVALID_ARGUMENT")
		s.GQL(t, q, map[string]any{"after": "1.snap_../../etc"}, key).OK(t, "snapshots", &theirs)
		if len(theirs.Edges) != 0 {
			t.Errorf("after a cursor past every snapshot: got %+v, want nothing", theirs)
		}
	})

	// Archives and GCS prefixes: TestBootstrapSources (bootstrap_test.go).
	e2e.Step(t, "source-refusals", func(t *testing.T) {
		_, err := c.Create(ctx, client.CreateRequest{Source: &client.Source{ArchiveURL: "http://storage.example/task.zip"}})
		wantClientError(t, "create from an http archive", err, http.StatusBadRequest, client.CodeInvalidArgument, "only https")
		_, err = c.Create(ctx, client.CreateRequest{Source: &client.Source{SnapshotID: snap.SnapshotID, GCSPrefix: "gs://b/p/"}})
		wantClientError(t, "create from two sources", err, http.StatusBadRequest, client.CodeInvalidArgument, "exactly one")
		_, err = c.Do(ctx, gqlCreate, map[string]any{"in": map[string]any{"source": map[string]any{"gcsPrefix": "gs://some-bucket/p/"}}}, nil)
		wantClientError(t, "GraphQL create from a GCS prefix", err, http.StatusOK, client.CodeInvalidArgument, "not permitted for this project")
	})

	e2e.Step(t, "delete", func(t *testing.T) {
		// The document's DELETE answers 200: checked on the wire, which the client does not show.
		s.Curl(t, http.MethodDelete, e2e.Prefix+"/snapshots/"+snap.SnapshotID, nil, key).Want(t, http.StatusOK)
		err := c.DeleteSnapshot(ctx, snap.SnapshotID)
		wantClientError(t, "delete "+snap.SnapshotID+" again", err, http.StatusNotFound, client.CodeNotFound)
		var data struct {
			DeleteSnapshot *struct{ DeletedSnapshotID string } `json:"deleteSnapshot"`
		}
		if _, err := c.Do(ctx, `mutation($id: ID!) { deleteSnapshot(id: $id) { deletedSnapshotId } }`, map[string]any{"id": final}, &data); err != nil || data.DeleteSnapshot == nil || data.DeleteSnapshot.DeletedSnapshotID != final {
			t.Errorf("deleteSnapshot(%s): got %v (%v), want true", final, data.DeleteSnapshot, err)
		}
		_, err = c.Snapshots(ctx, id, 0)
		wantClientError(t, "list of "+id+" without snapshots", err, http.StatusNotFound, client.CodeNotFound)
		// A stopped sandbox's latest snapshot is the only copy of its workspace.
		stopped, err := c.Stop(ctx, restored.ID)
		if err != nil {
			t.Fatalf("stop %s: %v", restored.ID, err)
		}
		err = c.DeleteSnapshot(ctx, stopped.LatestSnapshotID)
		wantClientError(t, "delete the only copy", err, http.StatusConflict, client.CodeInvalidState, "only copy", stopped.LatestSnapshotID)
		_, err = c.Snapshot(ctx, restored.ID)
		wantClientError(t, "snapshot of a stopped sandbox", err, http.StatusConflict, client.CodeInvalidState, "STOPPED")
	})
}

// snapshotIDs are the ids of the snapshots, in order.
func snapshotIDs(l []client.Snapshot) []string {
	out := []string{}
	for _, s := range l {
		out = append(out, s.ID)
	}
	return out
}
