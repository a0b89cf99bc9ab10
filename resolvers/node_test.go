package resolvers

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/sandbox"
)

// nodeFields selects what every node type says about itself.
const nodeFields = `__typename id ... on Sandbox { state profileName } ... on Snapshot { sandboxId } ... on ExecResult { execState: state } ... on AgentRun { status runExecId: execId }`

func TestNodeResolvesEachType(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	tests := []struct {
		id, typename string
	}{
		{apitest.SandboxRunning, "Sandbox"},
		{apitest.SnapLatest, "Snapshot"},
		{apitest.ExecEnded, "ExecResult"},
		{apitest.RunRunning, "AgentRun"},
	}
	for _, tt := range tests {
		t.Run(tt.typename, func(t *testing.T) {
			r := e.post(t, apitest.UserKey, `query($id: ID!) { node(id: $id) { `+nodeFields+` } }`, map[string]any{"id": tt.id})
			noErrors(t, r)
			var got struct {
				Typename string `json:"__typename"`
				ID       string
			}
			field(t, r, "node", &got)
			if got.Typename != tt.typename || got.ID != tt.id {
				t.Errorf("got %s %s, want %s %s", got.Typename, got.ID, tt.typename, tt.id)
			}
		})
	}
}

func TestNodeRefusesWhatIsNotTheCallers(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	for _, id := range []string{
		"sbx_01HOTHERTENANTXXXXXXXXXXXX",             // another tenant's sandbox: as missing
		"snap_01HOTHERTENANTXXXXXXXXXXXX_0000000001", // another tenant's snapshot
		"exec_other", "run_other", "usr_1", "", "sbx_", // no such object, no such type, empty
		strings.Repeat("x", 10_000), // oversize: the message quotes at most 64 bytes
	} {
		r := e.post(t, apitest.UserKey, `query($id: ID!) { node(id: $id) { id } }`, map[string]any{"id": id})
		if r.code(0) != "NOT_FOUND" || string(r.Data["node"]) != "null" {
			t.Errorf("node(%.20q): got data %s errors %+v, want null and NOT_FOUND", id, r.Data["node"], r.Errors)
		}
		if len(r.Errors) > 0 && len(r.Errors[0].Message) > 200 {
			t.Errorf("node(%.20q): the message is %d bytes, want it bounded", id, len(r.Errors[0].Message))
		}
	}
}

// TestNodesKeepsTheOthers: one bad id is null in its place with an error on its index; the
// others resolve.
func TestNodesKeepsTheOthers(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	ids := []string{apitest.SandboxRunning, "sbx_01HOTHERTENANTXXXXXXXXXXXX", apitest.RunDone, apitest.SandboxBoom}
	r := e.post(t, apitest.UserKey, `query($ids: [ID!]!) { nodes(ids: $ids) { id } }`, map[string]any{"ids": ids})
	var got []*struct{ ID string }
	field(t, r, "nodes", &got)
	if len(got) != 4 || got[0] == nil || got[0].ID != apitest.SandboxRunning || got[1] != nil || got[2] == nil || got[2].ID != apitest.RunDone || got[3] != nil {
		t.Fatalf("got %s, want the sandbox, null, the run, null", r.Data["nodes"])
	}
	codes := map[string]string{}
	for i := range r.Errors {
		codes[fmt.Sprint(r.Errors[i].Path)] = r.code(i)
	}
	want := map[string]string{"[nodes 1]": "NOT_FOUND", "[nodes 3]": "INTERNAL"}
	if fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Errorf("got errors %v, want %v", codes, want)
	}
	if strings.Contains(fmt.Sprint(r.Errors), apitest.SecretCause) {
		t.Errorf("an internal error's cause reached the client: %+v", r.Errors)
	}
}

func TestNodesIsBounded(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	ids := make([]string, MaxNodes+1)
	for i := range ids {
		ids[i] = apitest.SandboxRunning
	}
	r := e.post(t, apitest.UserKey, `query($ids: [ID!]!) { nodes(ids: $ids) { id } }`, map[string]any{"ids": ids})
	if r.code(0) != "INVALID_ARGUMENT" {
		t.Errorf("%d ids: got data %s errors %+v, want INVALID_ARGUMENT", len(ids), r.Data["nodes"], r.Errors)
	}
	if got := len(e.fake.CallsTo("Get")); got != 0 {
		t.Errorf("%d ids: the service was called %d times, want none", len(ids), got)
	}
	// The price counts the ids: 100 nodes with a deep selection cost 100 times one.
	one := e.post(t, apitest.UserKey, `query($ids: [ID!]!) { nodes(ids: $ids) { id } }`, map[string]any{"ids": ids[:1]})
	many := e.post(t, apitest.UserKey, `query($ids: [ID!]!) { nodes(ids: $ids) { id } }`, map[string]any{"ids": ids[:MaxNodes]})
	if p1, p100 := costPoints(t, one), costPoints(t, many); p100 < p1+MaxNodes-1 {
		t.Errorf("nodes of 1 id costs %d points, of %d ids %d: want the ids counted", p1, MaxNodes, p100)
	}
}

// TestReferencesBatch: the snapshots of a page name one sandbox; it is read once, however many
// snapshots refer to it, and the references resolve to the objects.
func TestReferencesBatch(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	snaps := make([]sandbox.SnapshotInfo, 40)
	for i := range snaps {
		snaps[i] = sandbox.SnapshotInfo{ID: fmt.Sprintf("snap_01HZZZZZZZZZZZZZZZZZZZZZZZ_%010d", i+1), SandboxID: apitest.SandboxRunning}
	}
	e.fake.Snapshots = snaps
	r := e.post(t, apitest.UserKey, `{ snapshots(first: 40) { nodes { id sandbox { id state profileName profile { name } } } } }`, nil)
	noErrors(t, r)
	var page struct {
		Nodes []struct {
			ID      string
			Sandbox *struct {
				ID, State, ProfileName string
				Profile                *struct{ Name string }
			}
		}
	}
	field(t, r, "snapshots", &page)
	got := page.Nodes
	if len(got) != 40 || got[39].Sandbox == nil || got[39].Sandbox.ID != apitest.SandboxRunning || got[39].Sandbox.ProfileName != "sandboxes-default" {
		t.Fatalf("got %s, want 40 snapshots with their sandbox", r.Data["snapshots"])
	}
	if n := len(e.fake.CallsTo("Get")); n != 1 {
		t.Errorf("the sandbox of 40 snapshots was read %d times, want once", n)
	}
}

func TestReferencesResolve(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	e.fake.Snapshots[0].SandboxID = "sbx_01HGONEXXXXXXXXXXXXXXXXXXX" // destroyed since: null, no error
	r := e.post(t, apitest.UserKey, `query($run: ID!) {
		agentRun(id: $run) { execId exec { id execId state } }
		snapshots { nodes { id sandboxId sandbox { id } } }
	}`, map[string]any{"run": apitest.RunRunning})
	noErrors(t, r)
	var run struct {
		ExecID string
		Exec   *struct{ ID, ExecID, State string }
	}
	field(t, r, "agentRun", &run)
	if run.Exec == nil || run.Exec.ID != apitest.ExecRunning || run.Exec.ExecID != run.ExecID || run.Exec.State != "RUNNING" {
		t.Errorf("agentRun.exec: got %+v, want the exec %s", run, apitest.ExecRunning)
	}
	var page struct {
		Nodes []struct {
			SandboxID string
			Sandbox   json.RawMessage
		}
	}
	field(t, r, "snapshots", &page)
	snaps := page.Nodes
	if string(snaps[0].Sandbox) != "null" || snaps[0].SandboxID == "" {
		t.Errorf("snapshot of a destroyed sandbox: got sandbox %s id %q, want null and the id kept", snaps[0].Sandbox, snaps[0].SandboxID)
	}
	if string(snaps[1].Sandbox) == "null" {
		t.Errorf("snapshot of a live sandbox: got sandbox null")
	}
}

func TestLatestSnapshot(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	e.fake.LatestSnapshot = apitest.SnapLatest
	r := e.post(t, apitest.UserKey, `query($id: ID!) { sandbox(id: $id) { latestSnapshotId latestSnapshot { id sizeBytes sandbox { id } } } }`,
		map[string]any{"id": apitest.SandboxRunning})
	noErrors(t, r)
	var got struct {
		LatestSnapshotID string
		LatestSnapshot   *struct {
			ID        string
			SizeBytes int64
			Sandbox   *struct{ ID string }
		}
	}
	field(t, r, "sandbox", &got)
	if got.LatestSnapshot == nil || got.LatestSnapshot.ID != apitest.SnapLatest || got.LatestSnapshot.SizeBytes != 5<<30 ||
		got.LatestSnapshot.Sandbox == nil || got.LatestSnapshot.Sandbox.ID != apitest.SandboxRunning {
		t.Errorf("got %s, want the latest snapshot and its sandbox", r.Data["sandbox"])
	}
}

// costPoints is extensions.cost.points of an answer.
func costPoints(t *testing.T, r gqlResponse) int64 {
	t.Helper()
	raw, ok := r.Extensions["cost"]
	if !ok {
		t.Fatalf("no extensions.cost in %+v", r)
	}
	var c struct{ Points int64 }
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	return c.Points
}
