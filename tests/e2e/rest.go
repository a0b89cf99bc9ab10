package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"testing"
	"time"
)

// CreateBody is the document's create body: the default profile.
const CreateBody = `{"profile":"sandboxes-default"}`

// SandboxJSON is a sandbox as REST answers it.
type SandboxJSON struct {
	SandboxID        string     `json:"sandbox_id"`
	TenantID         string     `json:"tenant_id"`
	ProjectID        string     `json:"project_id"`
	Profile          string     `json:"profile"`
	State            string     `json:"state"`
	StateReason      string     `json:"state_reason"`
	AutostopSec      int64      `json:"autostop_sec"`
	TTLSec           int64      `json:"ttl_sec"`
	LatestSnapshotID string     `json:"latest_snapshot_id"`
	CreatedAt        time.Time  `json:"created_at"`
	StateChangedAt   time.Time  `json:"state_changed_at"`
	ExpiresAt        *time.Time `json:"expires_at"`
	AutostopAt       *time.Time `json:"autostop_at"`
	// SnapshotID is only in a destroy's answer.
	SnapshotID string `json:"snapshot_id"`
	Resources  struct {
		MilliCPU    int64 `json:"milli_cpu"`
		MemoryBytes int64 `json:"memory_bytes"`
	} `json:"resources"`
}

// ListJSON is a page of sandboxes.
type ListJSON struct {
	Sandboxes  []SandboxJSON `json:"sandboxes"`
	NextCursor string        `json:"next_cursor"`
}

// ExecJSON is the result of a REST exec.
type ExecJSON struct {
	ExecID          string `json:"exec_id"`
	ExitCode        int    `json:"exit_code"`
	Signal          string `json:"signal"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutBase64    string `json:"stdout_base64"`
	StderrBase64    string `json:"stderr_base64"`
	TimedOut        bool   `json:"timed_out"`
	DurationMs      int64  `json:"duration_ms"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	Error           string `json:"error"`
}

// FileJSON is one entry of the files API.
type FileJSON struct {
	Name  string `json:"name"`
	Path  string `json:"path"`
	Size  int64  `json:"size"`
	Mode  string `json:"mode"`
	IsDir bool   `json:"is_dir"`
}

// FilesJSON is a folder listing of the files API.
type FilesJSON struct {
	Path      string     `json:"path"`
	Entries   []FileJSON `json:"entries"`
	Truncated bool       `json:"truncated"`
}

// SandboxIDPattern is the shape of a sandbox id: sbx_ and a ULID.
var SandboxIDPattern = regexp.MustCompile(`^sbx_[0-9A-HJKMNP-TV-Z]{26}$`)

// Create creates a sandbox through REST (201), tracks it for destruction and returns it.
func (s *Server) Create(t *testing.T, body string, headers ...string) SandboxJSON {
	t.Helper()
	r := s.Curl(t, http.MethodPost, Prefix, []byte(body), append([]string{HdrJSON}, headers...)...)
	r.Want(t, http.StatusCreated)
	var sb SandboxJSON
	r.Decode(t, &sb)
	if !SandboxIDPattern.MatchString(sb.SandboxID) {
		t.Fatalf("%s: got sandbox_id %q, want sbx_ and a ULID", r, sb.SandboxID)
	}
	s.Track(sb.SandboxID, headers...)
	if sb.State != "RUNNING" {
		t.Fatalf("%s: got state %q, want RUNNING", r, sb.State)
	}
	return sb
}

// Get returns a sandbox (200).
func (s *Server) Get(t *testing.T, id string, headers ...string) SandboxJSON {
	t.Helper()
	r := s.Curl(t, http.MethodGet, Prefix+"/"+id, nil, headers...)
	r.Want(t, http.StatusOK)
	var sb SandboxJSON
	r.Decode(t, &sb)
	return sb
}

// List returns the caller's sandboxes (200).
func (s *Server) List(t *testing.T, headers ...string) ListJSON {
	t.Helper()
	r := s.Curl(t, http.MethodGet, Prefix, nil, headers...)
	r.Want(t, http.StatusOK)
	var l ListJSON
	r.Decode(t, &l)
	return l
}

// Find returns the sandbox with this id from the page.
func (l ListJSON) Find(id string) (SandboxJSON, bool) {
	for _, sb := range l.Sandboxes {
		if sb.SandboxID == id {
			return sb, true
		}
	}
	return SandboxJSON{}, false
}

// Exec runs a command through REST and returns its result (200).
func (s *Server) Exec(t *testing.T, id, body string, headers ...string) ExecJSON {
	t.Helper()
	r := s.Curl(t, http.MethodPost, Prefix+"/"+id+"/exec", []byte(body), append([]string{HdrJSON}, headers...)...)
	r.Want(t, http.StatusOK)
	var res ExecJSON
	r.Decode(t, &res)
	return res
}

// Run runs argv (no shell) and wants exit code 0; it returns stdout.
func (s *Server) Run(t *testing.T, id string, argv []string, headers ...string) string {
	t.Helper()
	body := MustJSON(t, map[string]any{"command": argv, "timeout_sec": 60})
	res := s.Exec(t, id, body, headers...)
	if res.ExitCode != 0 || res.Signal != "" || res.TimedOut || res.Error != "" {
		t.Fatalf("exec %q: got exit %d signal %q timed_out %v error %q stderr %q, want exit 0",
			argv, res.ExitCode, res.Signal, res.TimedOut, res.Error, res.Stderr)
	}
	return res.Stdout
}

// Upload writes a file through the files API (curl -T: PUT, no Content-Type) and wants 200.
func (s *Server) Upload(t *testing.T, id, path string, content []byte, headers ...string) FileJSON {
	t.Helper()
	r := s.Curl(t, http.MethodPut, Prefix+"/"+id+"/files?path="+path, content, headers...)
	r.Want(t, http.StatusOK)
	var f FileJSON
	r.Decode(t, &f)
	if f.Size != int64(len(content)) {
		t.Fatalf("%s: got size %d, want %d", r, f.Size, len(content))
	}
	return f
}

// Download reads a file through the files API and wants 200.
func (s *Server) Download(t *testing.T, id, path string, headers ...string) string {
	t.Helper()
	r := s.Curl(t, http.MethodGet, Prefix+"/"+id+"/files?path="+path, nil, headers...)
	r.Want(t, http.StatusOK)
	return string(r.Body)
}

// MustJSON encodes v as JSON and fails the test when it cannot.
func MustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// QuotaJSON is the answer of GET …/quota.
type QuotaJSON struct {
	Limit int `json:"limit"`
	InUse int `json:"in_use"`
}

// ReadQuota is GET …/quota (safe in goroutines: it does not touch t).
func (s *Server) ReadQuota(headers ...string) (QuotaJSON, error) {
	r, err := s.Send(http.MethodGet, Prefix+"/quota", nil, headers...)
	if err != nil {
		return QuotaJSON{}, err
	}
	if r.Status != http.StatusOK {
		return QuotaJSON{}, fmt.Errorf("%s: got status %d, want 200", r, r.Status)
	}
	var q QuotaJSON
	if err := json.Unmarshal(r.Body, &q); err != nil {
		return QuotaJSON{}, fmt.Errorf("%s: decoding: %v", r, err)
	}
	return q, nil
}

// Quota is GET …/quota (200).
func (s *Server) Quota(t *testing.T, headers ...string) QuotaJSON {
	t.Helper()
	q, err := s.ReadQuota(headers...)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// ReadList lists up to 500 of the caller's sandboxes (safe in goroutines).
func (s *Server) ReadList(headers ...string) (ListJSON, error) {
	r, err := s.Send(http.MethodGet, Prefix+"?limit=500", nil, headers...)
	if err != nil {
		return ListJSON{}, err
	}
	if r.Status != http.StatusOK {
		return ListJSON{}, fmt.Errorf("%s: got status %d, want 200", r, r.Status)
	}
	var l ListJSON
	if err := json.Unmarshal(r.Body, &l); err != nil {
		return ListJSON{}, fmt.Errorf("%s: decoding: %v", r, err)
	}
	return l, nil
}

// ListAll lists up to 500 of the caller's sandboxes (200).
func (s *Server) ListAll(t *testing.T, headers ...string) ListJSON {
	t.Helper()
	l, err := s.ReadList(headers...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
