package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"testing"
	"time"
)

const createBody = `{"profile":"sandboxes-default"}`

type sandboxJSON struct {
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

type listJSON struct {
	Sandboxes  []sandboxJSON `json:"sandboxes"`
	NextCursor string        `json:"next_cursor"`
}

type execJSON struct {
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

type fileJSON struct {
	Name  string `json:"name"`
	Path  string `json:"path"`
	Size  int64  `json:"size"`
	Mode  string `json:"mode"`
	IsDir bool   `json:"is_dir"`
}

type filesJSON struct {
	Path      string     `json:"path"`
	Entries   []fileJSON `json:"entries"`
	Truncated bool       `json:"truncated"`
}

var sandboxIDPattern = regexp.MustCompile(`^sbx_[0-9A-HJKMNP-TV-Z]{26}$`)

// create creates a sandbox through REST (201), tracks it for destruction and returns it.
func (s *Server) create(t *testing.T, body string, headers ...string) sandboxJSON {
	t.Helper()
	r := s.curl(t, http.MethodPost, prefix, []byte(body), append([]string{hdrJSON}, headers...)...)
	r.want(t, http.StatusCreated)
	var sb sandboxJSON
	r.decode(t, &sb)
	if !sandboxIDPattern.MatchString(sb.SandboxID) {
		t.Fatalf("%s: got sandbox_id %q, want sbx_ and a ULID", r, sb.SandboxID)
	}
	s.track(sb.SandboxID, headers...)
	if sb.State != "RUNNING" {
		t.Fatalf("%s: got state %q, want RUNNING", r, sb.State)
	}
	return sb
}

// get returns a sandbox (200).
func (s *Server) get(t *testing.T, id string, headers ...string) sandboxJSON {
	t.Helper()
	r := s.curl(t, http.MethodGet, prefix+"/"+id, nil, headers...)
	r.want(t, http.StatusOK)
	var sb sandboxJSON
	r.decode(t, &sb)
	return sb
}

// list returns the caller's sandboxes (200).
func (s *Server) list(t *testing.T, headers ...string) listJSON {
	t.Helper()
	r := s.curl(t, http.MethodGet, prefix, nil, headers...)
	r.want(t, http.StatusOK)
	var l listJSON
	r.decode(t, &l)
	return l
}

func (l listJSON) find(id string) (sandboxJSON, bool) {
	for _, sb := range l.Sandboxes {
		if sb.SandboxID == id {
			return sb, true
		}
	}
	return sandboxJSON{}, false
}

// exec runs a command through REST and returns its result (200).
func (s *Server) exec(t *testing.T, id, body string, headers ...string) execJSON {
	t.Helper()
	r := s.curl(t, http.MethodPost, prefix+"/"+id+"/exec", []byte(body), append([]string{hdrJSON}, headers...)...)
	r.want(t, http.StatusOK)
	var res execJSON
	r.decode(t, &res)
	return res
}

// run runs argv (no shell) and wants exit code 0; it returns stdout.
func (s *Server) run(t *testing.T, id string, argv []string, headers ...string) string {
	t.Helper()
	body := mustJSON(t, map[string]any{"command": argv, "timeout_sec": 60})
	res := s.exec(t, id, body, headers...)
	if res.ExitCode != 0 || res.Signal != "" || res.TimedOut || res.Error != "" {
		t.Fatalf("exec %q: got exit %d signal %q timed_out %v error %q stderr %q, want exit 0",
			argv, res.ExitCode, res.Signal, res.TimedOut, res.Error, res.Stderr)
	}
	return res.Stdout
}

// upload writes a file through the files API (curl -T: PUT, no Content-Type) and wants 200.
func (s *Server) upload(t *testing.T, id, path string, content []byte, headers ...string) fileJSON {
	t.Helper()
	r := s.curl(t, http.MethodPut, prefix+"/"+id+"/files?path="+path, content, headers...)
	r.want(t, http.StatusOK)
	var f fileJSON
	r.decode(t, &f)
	if f.Size != int64(len(content)) {
		t.Fatalf("%s: got size %d, want %d", r, f.Size, len(content))
	}
	return f
}

// download reads a file through the files API and wants 200.
func (s *Server) download(t *testing.T, id, path string, headers ...string) string {
	t.Helper()
	r := s.curl(t, http.MethodGet, prefix+"/"+id+"/files?path="+path, nil, headers...)
	r.want(t, http.StatusOK)
	return string(r.Body)
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type quotaJSON struct {
	Limit int `json:"limit"`
	InUse int `json:"in_use"`
}

// readQuota is GET …/quota (safe in goroutines: it does not touch t).
func (s *Server) readQuota(headers ...string) (quotaJSON, error) {
	r, err := s.send(http.MethodGet, prefix+"/quota", nil, headers...)
	if err != nil {
		return quotaJSON{}, err
	}
	if r.Status != http.StatusOK {
		return quotaJSON{}, fmt.Errorf("%s: got status %d, want 200", r, r.Status)
	}
	var q quotaJSON
	if err := json.Unmarshal(r.Body, &q); err != nil {
		return quotaJSON{}, fmt.Errorf("%s: decoding: %v", r, err)
	}
	return q, nil
}

// quota is GET …/quota (200).
func (s *Server) quota(t *testing.T, headers ...string) quotaJSON {
	t.Helper()
	q, err := s.readQuota(headers...)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// readList lists up to 500 of the caller's sandboxes (safe in goroutines).
func (s *Server) readList(headers ...string) (listJSON, error) {
	r, err := s.send(http.MethodGet, prefix+"?limit=500", nil, headers...)
	if err != nil {
		return listJSON{}, err
	}
	if r.Status != http.StatusOK {
		return listJSON{}, fmt.Errorf("%s: got status %d, want 200", r, r.Status)
	}
	var l listJSON
	if err := json.Unmarshal(r.Body, &l); err != nil {
		return listJSON{}, fmt.Errorf("%s: decoding: %v", r, err)
	}
	return l, nil
}

// listAll lists up to 500 of the caller's sandboxes (200).
func (s *Server) listAll(t *testing.T, headers ...string) listJSON {
	t.Helper()
	l, err := s.readList(headers...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
