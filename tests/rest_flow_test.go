package tests

import (
	"net/http"
	"strings"
	"testing"

	"sandboxd/tests/e2e"
)

// The product document's calls, byte for byte.
const (
	// docCreateBody is the document's create body (curl -d '…'), with its line breaks.
	docCreateBody = `{
    "profile": "sandboxes-default",
    "autostop_sec": 1800,
    "ttl_sec": 14400
  }`
	// docExecBody is the document's exec body.
	docExecBody = `{"command":["bash","-lc","python -m pytest -q"],"timeout_sec":300}`
)

// testSample is a small pytest file uploaded into the workspace.
const testSample = `def test_arithmetic():
    assert 1 + 1 == 2
`

// TestDocumentFlowREST walks the product document through REST with its curl calls: create,
// exec twice in the same workspace, upload a test and run the document's pytest exec, list,
// stop (exec is then 409), start (the files are still there), destroy (a snapshot id), 404.
func TestDocumentFlowREST(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	key := e2e.HdrDev // X-Api-Key: $SANDBOX_API_KEY

	// curl -sS -X POST -H "X-Api-Key: …" -H "Content-Type: application/json" -d '{…}' $URL/sandbox/sandboxes/v1
	r := s.Curl(t, http.MethodPost, "/sandbox/sandboxes/v1", []byte(docCreateBody), key, "Content-Type: application/json")
	r.Want(t, http.StatusCreated)
	var sb e2e.SandboxJSON
	r.Decode(t, &sb)
	if sb.SandboxID != "" {
		s.Track(sb.SandboxID, key)
	}
	id := sb.SandboxID
	e2e.Step(t, "create", func(t *testing.T) {
		if !e2e.SandboxIDPattern.MatchString(id) {
			t.Fatalf("%s: got sandbox_id %q, want sbx_ and a ULID", r, id)
		}
		checks := []struct{ field, got, want string }{
			{"state", sb.State, "RUNNING"},
			{"profile", sb.Profile, "sandboxes-default"},
			{"tenant_id", sb.TenantID, "dev"},
			{"project_id", sb.ProjectID, "default"},
		}
		for _, c := range checks {
			if c.got != c.want {
				t.Errorf("%s: got %s %q, want %q", r, c.field, c.got, c.want)
			}
		}
		if sb.AutostopSec != 1800 || sb.TTLSec != 14400 {
			t.Errorf("%s: got autostop_sec %d ttl_sec %d, want 1800 and 14400", r, sb.AutostopSec, sb.TTLSec)
		}
		if sb.Resources.MilliCPU != 1000 || sb.Resources.MemoryBytes != 1024<<20 {
			t.Errorf("%s: got resources %+v, want the profile's 1000 milli_cpu and 1 GiB", r, sb.Resources)
		}
	})
	execPath := "/sandbox/sandboxes/v1/" + id + "/exec"

	e2e.Step(t, "exec-twice-same-workspace", func(t *testing.T) {
		r := s.Curl(t, http.MethodPost, execPath,
			[]byte(`{"command":["bash","-lc","echo hello from the first exec > notes.txt && pwd"],"timeout_sec":60}`),
			key, "Content-Type: application/json")
		r.Want(t, http.StatusOK)
		var first e2e.ExecJSON
		r.Decode(t, &first)
		if first.ExitCode != 0 || first.Stdout != "/workspace\n" {
			t.Fatalf("%s: got exit %d stdout %q, want 0 and /workspace", r, first.ExitCode, first.Stdout)
		}
		if !strings.HasPrefix(first.ExecID, "exec_") {
			t.Errorf("%s: got exec_id %q, want exec_…", r, first.ExecID)
		}
		r = s.Curl(t, http.MethodPost, execPath, []byte(`{"command":["bash","-lc","cat notes.txt"],"timeout_sec":60}`),
			key, "Content-Type: application/json")
		r.Want(t, http.StatusOK)
		var second e2e.ExecJSON
		r.Decode(t, &second)
		if second.ExitCode != 0 || second.Stdout != "hello from the first exec\n" {
			t.Fatalf("%s: got exit %d stdout %q, want 0 and the first exec's line", r, second.ExitCode, second.Stdout)
		}
	})

	e2e.Step(t, "upload-and-run-pytest", func(t *testing.T) {
		// curl -T test_sample.py "$URL/…/files?path=test_sample.py"
		s.Upload(t, id, "test_sample.py", []byte(testSample), key)
		r := s.Curl(t, http.MethodPost, execPath, []byte(docExecBody), key, "Content-Type: application/json")
		r.Want(t, http.StatusOK)
		var res e2e.ExecJSON
		r.Decode(t, &res)
		if res.ExitCode != 0 || res.TimedOut || !strings.Contains(res.Stdout, "1 passed") {
			t.Fatalf("%s: got exit %d timed_out %v stdout %q stderr %q, want exit 0 and \"1 passed\"",
				r, res.ExitCode, res.TimedOut, res.Stdout, res.Stderr)
		}
	})

	e2e.Step(t, "list-and-files", func(t *testing.T) {
		got, ok := s.List(t, key).Find(id)
		if !ok || got.State != "RUNNING" {
			t.Errorf("list: got %+v (found %v), want %s RUNNING", got, ok, id)
		}
		r := s.Curl(t, http.MethodGet, "/sandbox/sandboxes/v1/"+id+"/files/list", nil, key)
		r.Want(t, http.StatusOK)
		var l e2e.FilesJSON
		r.Decode(t, &l)
		names := map[string]bool{}
		for _, e := range l.Entries {
			names[e.Name] = true
		}
		if !names["notes.txt"] || !names["test_sample.py"] {
			t.Errorf("%s: got entries %v, want notes.txt and test_sample.py", r, names)
		}
		if got := s.Download(t, id, "test_sample.py", key); got != testSample {
			t.Errorf("download test_sample.py: got %q, want %q", got, testSample)
		}
	})

	e2e.Step(t, "stop", func(t *testing.T) {
		// curl -sS -X POST -H "X-Api-Key: …" "$URL/…/$SANDBOX_ID/stop"
		r := s.Curl(t, http.MethodPost, "/sandbox/sandboxes/v1/"+id+"/stop", nil, key)
		r.Want(t, http.StatusOK)
		var got e2e.SandboxJSON
		r.Decode(t, &got)
		if got.State != "STOPPED" {
			t.Fatalf("%s: got state %q, want STOPPED", r, got.State)
		}
		if got.LatestSnapshotID == "" {
			t.Errorf("%s: got no latest_snapshot_id, want the stop's checkpoint", r)
		}
		if st := s.Get(t, id, key).State; st != "STOPPED" {
			t.Errorf("GET after stop: got state %q, want STOPPED", st)
		}
		r = s.Curl(t, http.MethodPost, execPath, []byte(`{"command":["true"]}`), key, "Content-Type: application/json")
		e := r.WantError(t, http.StatusConflict, "INVALID_STATE", "STOPPED")
		if e.Error.State != "" && e.Error.State != "STOPPED" {
			t.Errorf("%s: got error state %q, want STOPPED", r, e.Error.State)
		}
		r = s.Curl(t, http.MethodPost, "/sandbox/sandboxes/v1/"+id+"/stop", nil, key)
		r.WantError(t, http.StatusConflict, "INVALID_STATE")
	})

	e2e.Step(t, "start", func(t *testing.T) {
		r := s.Curl(t, http.MethodPost, "/sandbox/sandboxes/v1/"+id+"/start", nil, key)
		r.Want(t, http.StatusOK)
		var got e2e.SandboxJSON
		r.Decode(t, &got)
		if got.State != "RUNNING" {
			t.Fatalf("%s: got state %q, want RUNNING", r, got.State)
		}
		if out := s.Run(t, id, []string{"cat", "notes.txt"}, key); out != "hello from the first exec\n" {
			t.Errorf("after start: got notes.txt %q, want the first exec's line", out)
		}
		if got := s.Download(t, id, "test_sample.py", key); got != testSample {
			t.Errorf("after start: got test_sample.py %q, want %q", got, testSample)
		}
	})

	e2e.Step(t, "destroy", func(t *testing.T) {
		// curl -sS -X DELETE -H "X-Api-Key: …" "$URL/…/$SANDBOX_ID"
		r := s.Curl(t, http.MethodDelete, "/sandbox/sandboxes/v1/"+id, nil, key)
		r.Want(t, http.StatusOK)
		var got e2e.SandboxJSON
		r.Decode(t, &got)
		if got.SnapshotID == "" {
			t.Errorf("%s: got an empty snapshot_id, want the final checkpoint", r)
		}
		if got.SandboxID != id {
			t.Errorf("%s: got sandbox_id %q, want %s", r, got.SandboxID, id)
		}
		s.Curl(t, http.MethodGet, "/sandbox/sandboxes/v1/"+id, nil, key).WantError(t, http.StatusNotFound, "NOT_FOUND")
		s.Curl(t, http.MethodPost, execPath, []byte(`{"command":["true"]}`), key, e2e.HdrJSON).WantError(t, http.StatusNotFound, "NOT_FOUND")
		s.Curl(t, http.MethodDelete, "/sandbox/sandboxes/v1/"+id, nil, key).WantError(t, http.StatusNotFound, "NOT_FOUND")
		if _, ok := s.List(t, key).Find(id); ok {
			t.Errorf("list after destroy: got %s, want it gone", id)
		}
	})
}
