package tests

import (
	"strings"
	"testing"

	"sandboxd/tests/e2e"
)

// GraphQL documents used by several tests.
const (
	gqlSandboxFields = `id tenantId projectId profileName state stateReason autostopSec ttlSec latestSnapshotId
		resources { milliCpu memoryBytes }`
	gqlExecFields = `execId exitCode signal timedOut durationMs stdout stderr stdoutBase64 stdoutTruncated stderrTruncated error`

	gqlCreate  = `mutation($in: CreateSandboxInput!) { createSandbox(input: $in) { sandbox { ` + gqlSandboxFields + ` } } }`
	gqlGet     = `query($id: ID!) { sandbox(id: $id) { ` + gqlSandboxFields + ` } }`
	gqlList    = `query { sandboxes(first: 500) { nodes { id state } pageInfo { hasNextPage } } }`
	gqlExec    = `mutation($id: ID!, $in: ExecInput!) { exec(sandboxId: $id, input: $in) { exec { ` + gqlExecFields + ` } } }`
	gqlStop    = `mutation($id: ID!) { stopSandbox(id: $id) { sandbox { ` + gqlSandboxFields + ` } } }`
	gqlStart   = `mutation($id: ID!) { startSandbox(id: $id) { sandbox { ` + gqlSandboxFields + ` } } }`
	gqlDestroy = `mutation($id: ID!) { destroySandbox(id: $id) { snapshotId sandbox { id state } } }`
	gqlWrite   = `mutation($id: ID!, $path: String!, $content: String) {
		writeFile(sandboxId: $id, path: $path, content: $content) { file { name path size isDir } } }`
	gqlRead = `query($id: ID!, $path: String!) { readFile(sandboxId: $id, path: $path) {
		path content contentBase64 size truncated file { name size } } }`
	gqlListFiles = `query($id: ID!, $path: String) { listFiles(sandboxId: $id, path: $path) {
		path nodes { name isDir size } pageInfo { hasNextPage endCursor } } }`
)

type gqlSandbox struct {
	ID               string  `json:"id"`
	TenantID         string  `json:"tenantId"`
	ProjectID        string  `json:"projectId"`
	Profile          string  `json:"profileName"`
	State            string  `json:"state"`
	StateReason      *string `json:"stateReason"`
	AutostopSec      int     `json:"autostopSec"`
	TTLSec           int     `json:"ttlSec"`
	LatestSnapshotID *string `json:"latestSnapshotId"`
	Resources        struct {
		MilliCPU    int   `json:"milliCpu"`
		MemoryBytes int64 `json:"memoryBytes"`
	} `json:"resources"`
}

type gqlExecResult struct {
	ExecID          string  `json:"execId"`
	ExitCode        int     `json:"exitCode"`
	Signal          *string `json:"signal"`
	TimedOut        bool    `json:"timedOut"`
	DurationMs      int64   `json:"durationMs"`
	Stdout          string  `json:"stdout"`
	Stderr          string  `json:"stderr"`
	StdoutBase64    string  `json:"stdoutBase64"`
	StdoutTruncated bool    `json:"stdoutTruncated"`
	StderrTruncated bool    `json:"stderrTruncated"`
	Error           *string `json:"error"`
}

type gqlFileContent struct {
	Path          string  `json:"path"`
	Content       *string `json:"content"`
	ContentBase64 string  `json:"contentBase64"`
	Size          int64   `json:"size"`
	Truncated     bool    `json:"truncated"`
}

// gqlExecOK runs a command through GraphQL and wants exit 0; it returns stdout.
func gqlExecOK(t *testing.T, s *e2e.Server, id string, argv []string, headers ...string) string {
	t.Helper()
	var res gqlExecResult
	s.GQL(t, gqlExec, map[string]any{"id": id, "in": map[string]any{"command": argv, "timeoutSec": 60}}, headers...).
		OK(t, "exec.exec", &res)
	if res.ExitCode != 0 || res.Signal != nil || res.TimedOut || res.Error != nil {
		t.Fatalf("exec %q: got %+v, want exit 0", argv, res)
	}
	return res.Stdout
}

// TestDocumentFlowGraphQL walks the same flow as TestDocumentFlowREST through POST /graphql.
func TestDocumentFlowGraphQL(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	key := e2e.HdrDev

	var sb gqlSandbox
	s.GQL(t, gqlCreate, map[string]any{"in": map[string]any{"profile": "sandboxes-default", "autostopSec": 1800, "ttlSec": 14400}}, key).
		OK(t, "createSandbox.sandbox", &sb)
	if sb.ID != "" {
		s.Track(sb.ID, key)
	}
	id := sb.ID
	e2e.Step(t, "create", func(t *testing.T) {
		if !e2e.SandboxIDPattern.MatchString(id) {
			t.Fatalf("got id %q, want sbx_ and a ULID", id)
		}
		if sb.State != "RUNNING" || sb.Profile != "sandboxes-default" || sb.AutostopSec != 1800 || sb.TTLSec != 14400 ||
			sb.TenantID != "dev" || sb.ProjectID != "default" {
			t.Errorf("got %+v, want RUNNING sandboxes-default 1800/14400 of dev:default", sb)
		}
		if sb.Resources.MilliCPU != 1000 || sb.Resources.MemoryBytes != 1024<<20 {
			t.Errorf("got resources %+v, want 1000 milliCpu and 1 GiB memoryBytes", sb.Resources)
		}
		var got gqlSandbox
		s.GQL(t, gqlGet, map[string]any{"id": id}, key).OK(t, "sandbox", &got)
		if got.ID != id || got.State != "RUNNING" {
			t.Errorf("sandbox(id): got %+v, want %s RUNNING", got, id)
		}
	})

	e2e.Step(t, "exec-twice-same-workspace", func(t *testing.T) {
		if out := gqlExecOK(t, s, id, []string{"bash", "-lc", "echo from graphql > notes.txt && pwd"}, key); out != "/workspace\n" {
			t.Errorf("got stdout %q, want /workspace", out)
		}
		if out := gqlExecOK(t, s, id, []string{"cat", "notes.txt"}, key); out != "from graphql\n" {
			t.Errorf("got stdout %q, want the first exec's line", out)
		}
	})

	e2e.Step(t, "write-file-and-run-pytest", func(t *testing.T) {
		var fi struct {
			Name string `json:"name"`
			Size int64  `json:"size"`
		}
		s.GQL(t, gqlWrite, map[string]any{"id": id, "path": "test_sample.py", "content": testSample}, key).OK(t, "writeFile.file", &fi)
		if fi.Name != "test_sample.py" || fi.Size != int64(len(testSample)) {
			t.Errorf("writeFile: got %+v, want test_sample.py of %d bytes", fi, len(testSample))
		}
		var res gqlExecResult
		s.GQL(t, gqlExec, map[string]any{"id": id, "in": map[string]any{
			"command": []string{"bash", "-lc", "python -m pytest -q"}, "timeoutSec": 300}}, key).OK(t, "exec.exec", &res)
		if res.ExitCode != 0 || !strings.Contains(res.Stdout, "1 passed") {
			t.Fatalf("pytest: got %+v, want exit 0 and \"1 passed\"", res)
		}
	})

	e2e.Step(t, "list-and-files", func(t *testing.T) {
		var conn struct {
			Nodes []gqlSandbox `json:"nodes"`
		}
		s.GQL(t, gqlList, nil, key).OK(t, "sandboxes", &conn)
		found := false
		for _, n := range conn.Nodes {
			found = found || (n.ID == id && n.State == "RUNNING")
		}
		if !found {
			t.Errorf("sandboxes: got %+v, want %s RUNNING", conn.Nodes, id)
		}
		var listing struct {
			Nodes []struct {
				Name string `json:"name"`
			} `json:"nodes"`
		}
		s.GQL(t, gqlListFiles, map[string]any{"id": id}, key).OK(t, "listFiles", &listing)
		names := map[string]bool{}
		for _, e := range listing.Nodes {
			names[e.Name] = true
		}
		if !names["notes.txt"] || !names["test_sample.py"] {
			t.Errorf("listFiles: got %v, want notes.txt and test_sample.py", names)
		}
		var fc gqlFileContent
		s.GQL(t, gqlRead, map[string]any{"id": id, "path": "test_sample.py"}, key).OK(t, "readFile", &fc)
		if fc.Content == nil || *fc.Content != testSample || fc.Size != int64(len(testSample)) {
			t.Errorf("readFile: got %+v, want the uploaded test", fc)
		}
	})

	e2e.Step(t, "stop", func(t *testing.T) {
		var got gqlSandbox
		s.GQL(t, gqlStop, map[string]any{"id": id}, key).OK(t, "stopSandbox.sandbox", &got)
		if got.State != "STOPPED" {
			t.Fatalf("stopSandbox: got state %q, want STOPPED", got.State)
		}
		if got.LatestSnapshotID == nil || *got.LatestSnapshotID == "" {
			t.Errorf("stopSandbox: got no latestSnapshotId, want the stop's checkpoint")
		}
		s.GQL(t, gqlExec, map[string]any{"id": id, "in": map[string]any{"command": []string{"true"}}}, key).
			WantCode(t, 200, "INVALID_STATE", "STOPPED")
	})

	e2e.Step(t, "start", func(t *testing.T) {
		var got gqlSandbox
		s.GQL(t, gqlStart, map[string]any{"id": id}, key).OK(t, "startSandbox.sandbox", &got)
		if got.State != "RUNNING" {
			t.Fatalf("startSandbox: got state %q, want RUNNING", got.State)
		}
		var fc gqlFileContent
		s.GQL(t, gqlRead, map[string]any{"id": id, "path": "notes.txt"}, key).OK(t, "readFile", &fc)
		if fc.Content == nil || *fc.Content != "from graphql\n" {
			t.Errorf("readFile after start: got %+v, want the first exec's line", fc)
		}
	})

	e2e.Step(t, "destroy", func(t *testing.T) {
		var got struct {
			SnapshotID *string `json:"snapshotId"`
			Sandbox    struct {
				ID string `json:"id"`
			} `json:"sandbox"`
		}
		s.GQL(t, gqlDestroy, map[string]any{"id": id}, key).OK(t, "destroySandbox", &got)
		if got.SnapshotID == nil || *got.SnapshotID == "" || got.Sandbox.ID != id {
			t.Errorf("destroySandbox: got snapshotId %v sandbox %q, want a snapshot id and %s", got.SnapshotID, got.Sandbox.ID, id)
		}
		g := s.GQL(t, gqlGet, map[string]any{"id": id}, key)
		g.WantCode(t, 200, "NOT_FOUND")
		if string(g.Data["sandbox"]) != "null" {
			t.Errorf("%s: got data.sandbox %s, want null", g, g.Data["sandbox"])
		}
	})
}
