package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"sandboxd/internal/auth"
	"sandboxd/internal/source/sourcetest"
)

// The API keys of every test server. SANDBOX_API_KEY (keyDev) is the document's key: the
// development principal dev:default.
const (
	keyDev      = "e2e-dev-key-6f1d2c3b4a59"
	keyTenant1  = "e2e-tenant1-key-0b7e41c2d9"
	keyTenant2  = "e2e-tenant2-key-93a5f0e8c1"
	keyPlatform = "e2e-platform-key-5c2d8e7f10"
)

// Headers, written the way curl -H takes them.
const (
	hdrJSON     = "Content-Type: application/json"
	hdrDev      = "X-Api-Key: " + keyDev
	hdrTenant1  = "X-Api-Key: " + keyTenant1
	hdrTenant2  = "X-Api-Key: " + keyTenant2
	hdrPlatform = "X-Api-Key: " + keyPlatform
)

// prefix is the root of the documented REST paths.
const prefix = "/sandbox/sandboxes/v1"

// ---- state folders ----

// stateDir is a sandboxd state folder and checkpoint folder; replicas and restarts share one.
type stateDir struct {
	Dir         string
	Checkpoints string
}

// newStateDir makes a state folder. When the test ends (after every server on it stopped) no
// runsc container, mount or loop device may be left in it: one that is, is an error and is
// removed.
func newStateDir(t *testing.T) *stateDir {
	t.Helper()
	requireComponents(t)
	dir, err := os.MkdirTemp(suite.root, "state-")
	if err != nil {
		t.Fatal(err)
	}
	suite.mu.Lock()
	suite.stateDirs = append(suite.stateDirs, dir)
	suite.mu.Unlock()
	sd := &stateDir{Dir: dir, Checkpoints: filepath.Join(dir, "checkpoints")}
	t.Cleanup(func() {
		ids, err := leftoverContainers(dir)
		if err != nil {
			t.Errorf("checking for leftover containers: %v", err)
			return
		}
		if len(ids) > 0 {
			t.Errorf("got runsc containers %v left in %s after the test, want none (every sandbox is destroyed)", ids, runscRoot(dir))
			forceDelete(dir, ids)
		}
		// A stopped server's state folder can be removed: no mount (runsc's null-netns, a
		// sandbox's disk) and no loop device is left in it.
		if m, l := mountsUnder(dir), loopsBacking(dir); len(m) > 0 || len(l) > 0 {
			t.Errorf("got mounts %q and loop devices %q left under %s after every server on it stopped, want none (rm -rf of the folder fails with EBUSY)", m, l, dir)
			unmountUnder(dir)
		}
	})
	return sd
}

// ---- servers ----

// serverOptions configure one sandboxd process.
type serverOptions struct {
	// State is the state folder; nil makes a new one.
	State *stateDir
	// RedisURL is the Redis to use; "" runs sandboxd's embedded Redis.
	RedisURL string
	// Limits are merged over sandboxd's default limits (config file keys).
	Limits map[string]any
	// Extra are further top-level config keys, set over the harness's own (e.g. "quota",
	// "reconcile_interval_ms"). The harness sets quota: {default_limit: 0} (unlimited) unless
	// Extra sets "quota".
	Extra map[string]any
	// Env are further environment variables of the server ("NAME=value").
	Env []string
}

// Server is one running sandboxd process.
type Server struct {
	// URL is the server's base URL (http://127.0.0.1:port).
	URL   string
	Addr  string
	State *stateDir

	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	waitErr error
	client  *http.Client

	mu      sync.Mutex
	stopped bool
	// tracked are the sandboxes to destroy when the test ends, with the headers to do it.
	tracked map[string][]string
}

var serverSeq struct {
	sync.Mutex
	n int
}

// startServer starts sandboxd and waits until /readyz answers 200. The server is stopped (with
// SIGTERM, then SIGKILL) when the test ends, after the sandboxes it tracks are destroyed; its log
// goes to the test log when the test failed.
func startServer(t *testing.T, opts serverOptions) *Server {
	t.Helper()
	requireComponents(t)
	if opts.State == nil {
		opts.State = newStateDir(t)
	}
	serverSeq.Lock()
	serverSeq.n++
	n := serverSeq.n
	serverSeq.Unlock()
	name := fmt.Sprintf("%s-%d", strings.NewReplacer("/", "_").Replace(t.Name()), n)
	addr := freeAddr(t)
	cfgPath := filepath.Join(suite.root, name+".yaml")
	writeConfig(t, cfgPath, opts)
	args := []string{"--config", cfgPath, "--listen", addr, "--state-dir", opts.State.Dir,
		"--checkpoint-dir", opts.State.Checkpoints, "--runsc", suite.runsc, "--init-binary", suite.initBin,
		"--rootfs", suite.rootfs}
	if opts.RedisURL != "" {
		args = append(args, "--redis-url", opts.RedisURL)
	}
	s := &Server{URL: "http://" + addr, Addr: addr, State: opts.State, name: name,
		logPath: filepath.Join(suite.root, name+".log"), done: make(chan struct{}),
		client: &http.Client{Timeout: 10 * time.Minute}, tracked: map[string][]string{}}
	logFile, err := os.Create(s.logPath)
	if err != nil {
		t.Fatal(err)
	}
	s.cmd = exec.Command(suite.sandboxd, args...)
	s.cmd.Env = append(serverEnv(), opts.Env...)
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	if err := s.cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("starting sandboxd: %v", err)
	}
	go func() {
		s.waitErr = s.cmd.Wait()
		logFile.Close()
		close(s.done)
	}()
	t.Cleanup(func() {
		s.destroyTracked(t)
		s.Stop(t)
		if t.Failed() {
			s.dumpLog(t)
		}
	})
	s.waitReady(t)
	return s
}

// serverEnv is the test's environment without sandboxd's own variables, plus SANDBOX_API_KEY.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == "REDIS_URL" || name == "SANDBOX_API_KEY" || name == "SANDBOX_CONCURRENCY_LIMIT" ||
			strings.HasPrefix(name, "SANDBOXD_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "SANDBOX_API_KEY="+keyDev)
}

// writeConfig writes the server's YAML config: the test keys, the profiles, the limits, no
// concurrency limit (quota.default_limit 0) and opts.Extra.
func writeConfig(t *testing.T, path string, opts serverOptions) {
	t.Helper()
	cfg := map[string]any{
		"api_keys": []map[string]any{
			{"name": "tenant1", "sha256": auth.HashKey(keyTenant1), "tenant": "t1", "project": "p1"},
			{"name": "tenant2", "sha256": auth.HashKey(keyTenant2), "tenant": "t2", "project": "p1"},
			{"name": "platform", "sha256": auth.HashKey(keyPlatform), "tenant": "platform", "project": "ops", "platform": true},
		},
		"profiles": []map[string]any{
			{"name": "sandboxes-default", "description": "the document's profile", "rootfs": suite.rootfs,
				"milli_cpu": 1000, "memory_mb": 1024},
			{"name": "tiny", "description": "64 MiB, for out-of-memory tests", "rootfs": suite.rootfs,
				"milli_cpu": 1000, "memory_mb": 64},
		},
		"shutdown_sec": 10,
		"log_level":    "debug",
		// Unlimited, so that tests about other things are not limited by the default of 10.
		"quota": map[string]any{"default_limit": 0},
	}
	if opts.Limits != nil {
		cfg["limits"] = opts.Limits
	}
	for k, v := range opts.Extra {
		cfg[k] = v
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// archiveHost starts an HTTPS server on loopback (sourcetest.Server: a certificate of its own,
// requests counted per path) for sandboxd to fetch source.archive_url from, and returns it with
// the config section that lets it: sources.allow_hosts names its host:port (loopback is refused
// otherwise) and sources.ca_file its certificate, written into the suite's folder. Add further
// sources keys to the map before passing it as serverOptions.Extra["sources"].
func archiveHost(t *testing.T) (*sourcetest.Server, map[string]any) {
	t.Helper()
	srv := sourcetest.NewServer(t)
	return srv, map[string]any{
		"allow_hosts": []string{srv.Host()},
		"ca_file":     srv.WriteCA(t, suite.root),
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func (s *Server) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	last := ""
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			t.Fatalf("sandboxd exited before it was ready (%v); its log:\n%s", s.waitErr, s.logTail(200))
		default:
		}
		resp, err := http.Get(s.URL + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, body)
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("sandboxd at %s was not ready within 90s (last /readyz: %s); its log:\n%s", s.URL, last, s.logTail(200))
}

// Stop stops the server with SIGTERM (SIGKILL after 30 s) and checks that it exited cleanly and
// that its log holds no data race or panic. Sandboxes keep running. Stop is idempotent.
func (s *Server) Stop(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	s.mu.Unlock()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		t.Errorf("sandboxd %s did not exit within 30s of SIGTERM; killing pid %d", s.name, s.cmd.Process.Pid)
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	if s.waitErr != nil {
		t.Errorf("sandboxd %s exited with %v after SIGTERM, want exit status 0", s.name, s.waitErr)
	}
	log, _ := os.ReadFile(s.logPath)
	if i := bytes.Index(log, []byte("WARNING: DATA RACE")); i >= 0 {
		t.Errorf("sandboxd %s reported a data race:\n%s", s.name, excerpt(log, i, 6000))
	}
	for _, marker := range []string{"\npanic: ", "graphql: panic", "fatal error: "} {
		if i := bytes.Index(log, []byte(marker)); i >= 0 {
			t.Errorf("sandboxd %s log has %q:\n%s", s.name, strings.TrimSpace(marker), excerpt(log, i, 4000))
		}
	}
}

// Kill kills the server with SIGKILL (by its PID), as a crash would, and waits for it to exit.
// Its sandboxes keep running; the tracked ones are not destroyed through it. The log is still
// checked for a data race or panic before the kill.
func (s *Server) Kill(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	s.mu.Unlock()
	if err := syscall.Kill(s.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Errorf("SIGKILL to sandboxd %s (pid %d): %v", s.name, s.cmd.Process.Pid, err)
	}
	<-s.done
	log, _ := os.ReadFile(s.logPath)
	if i := bytes.Index(log, []byte("WARNING: DATA RACE")); i >= 0 {
		t.Errorf("sandboxd %s reported a data race:\n%s", s.name, excerpt(log, i, 6000))
	}
	for _, marker := range []string{"\npanic: ", "graphql: panic", "fatal error: "} {
		if i := bytes.Index(log, []byte(marker)); i >= 0 {
			t.Errorf("sandboxd %s log has %q:\n%s", s.name, strings.TrimSpace(marker), excerpt(log, i, 4000))
		}
	}
}

func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.stopped
}

func excerpt(b []byte, i, n int) string {
	return string(b[i:min(len(b), i+n)])
}

func (s *Server) logTail(lines int) string {
	data, err := os.ReadFile(s.logPath)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = append([]string{fmt.Sprintf("… (%d earlier lines in %s)", len(all)-lines, s.logPath)}, all[len(all)-lines:]...)
	}
	return strings.Join(all, "\n")
}

func (s *Server) dumpLog(t *testing.T) {
	t.Logf("sandboxd %s log (%s):\n%s", s.name, s.logPath, s.logTail(400))
}

// track registers a sandbox to destroy (with these headers) when the test ends.
func (s *Server) track(id string, headers ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tracked[id] = headers
}

// destroyTracked destroys the tracked sandboxes that still exist, retrying while they are busy.
func (s *Server) destroyTracked(t *testing.T) {
	t.Helper()
	if !s.running() {
		return
	}
	s.mu.Lock()
	tracked := s.tracked
	s.tracked = map[string][]string{}
	s.mu.Unlock()
	for id, headers := range tracked {
		deadline := time.Now().Add(90 * time.Second)
		for {
			r, err := s.send(http.MethodDelete, prefix+"/"+id, nil, headers...)
			if err != nil {
				t.Errorf("cleanup: destroying %s: %v", id, err)
				break
			}
			if r.Status == http.StatusOK || r.Status == http.StatusNotFound {
				break
			}
			if (r.Status == http.StatusConflict || r.Status == http.StatusServiceUnavailable) && time.Now().Before(deadline) {
				time.Sleep(time.Second)
				continue
			}
			t.Errorf("cleanup: %s", r)
			break
		}
	}
}

// ---- HTTP ----

// Response is a finished HTTP exchange.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
	// Request is "METHOD path", for messages.
	Request string
}

func (r *Response) String() string {
	body := string(r.Body)
	if len(body) > 2000 {
		body = body[:2000] + fmt.Sprintf("… (%d bytes)", len(r.Body))
	}
	return fmt.Sprintf("%s → %d %s", r.Request, r.Status, strings.TrimSpace(body))
}

// send makes one request. Headers are "Name: value" as curl -H takes them; a nil body sends
// none (curl -X POST without -d).
func (s *Server) send(method, path string, body io.Reader, headers ...string) (*Response, error) {
	return s.sendContext(context.Background(), method, path, body, headers...)
}

func (s *Server) sendContext(ctx context.Context, method, path string, body io.Reader, headers ...string) (*Response, error) {
	return s.sendVia(ctx, s.client, method, path, body, headers...)
}

// sendVia makes one request with HTTP client c (a client of its own, with its own connections).
func (s *Server) sendVia(ctx context.Context, c *http.Client, method, path string, body io.Reader, headers ...string) (*Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", "curl/8.5.0")
	req.Header.Set("Accept", "*/*")
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok {
			return nil, fmt.Errorf("header %q is not \"Name: value\"", h)
		}
		req.Header.Set(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: data, Request: method + " " + path}, nil
}

// curl makes one request and fails the test when it cannot be made.
func (s *Server) curl(t *testing.T, method, path string, body []byte, headers ...string) *Response {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	r, err := s.send(method, path, rd, headers...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// want fails the test unless the status is want.
func (r *Response) want(t *testing.T, status int) {
	t.Helper()
	if r.Status != status {
		t.Fatalf("%s: got status %d, want %d", r, r.Status, status)
	}
}

// decode decodes a JSON answer into v.
func (r *Response) decode(t *testing.T, v any) {
	t.Helper()
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("%s: got Content-Type %q, want application/json", r, ct)
	}
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("%s: decoding the answer: %v", r, err)
	}
}

// apiError is the REST error body.
type apiError struct {
	Error struct {
		Code          string `json:"code"`
		Message       string `json:"message"`
		State         string `json:"state"`
		RetryAfterSec int    `json:"retry_after_sec"`
		// Limit and InUse are in a QUOTA_EXCEEDED error.
		Limit *int `json:"limit"`
		InUse *int `json:"in_use"`
	} `json:"error"`
}

// wantError reports (without stopping the test) unless the answer is an error with this status
// and code whose message mentions every one of mention (case-insensitively).
func (r *Response) wantError(t *testing.T, status int, code string, mention ...string) apiError {
	t.Helper()
	var e apiError
	if r.Status != status {
		t.Errorf("%s: got status %d, want %d %s", r, r.Status, status, code)
		return e
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("%s: got Content-Type %q, want application/json", r, ct)
		return e
	}
	if err := json.Unmarshal(r.Body, &e); err != nil {
		t.Errorf("%s: decoding the error: %v", r, err)
		return e
	}
	if e.Error.Code != code {
		t.Errorf("%s: got code %q, want %q", r, e.Error.Code, code)
	}
	if e.Error.Message == "" {
		t.Errorf("%s: got an empty error message", r)
	}
	for _, m := range mention {
		if !strings.Contains(strings.ToLower(e.Error.Message), strings.ToLower(m)) {
			t.Errorf("%s: got message %q, want it to mention %q", r, e.Error.Message, m)
		}
	}
	return e
}

// ---- REST shapes ----

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

// ---- GraphQL over HTTP ----

type gqlError struct {
	Message    string         `json:"message"`
	Path       []any          `json:"path"`
	Extensions map[string]any `json:"extensions"`
}

func (e gqlError) code() string {
	c, _ := e.Extensions["code"].(string)
	return c
}

// gqlResult is a GraphQL answer over HTTP.
type gqlResult struct {
	resp   *Response
	Data   map[string]json.RawMessage `json:"data"`
	Errors []gqlError                 `json:"errors"`
}

func (g *gqlResult) String() string { return g.resp.String() }

// gql posts a GraphQL operation (application/json) and decodes the answer.
func (s *Server) gql(t *testing.T, query string, vars map[string]any, headers ...string) *gqlResult {
	t.Helper()
	body := map[string]any{"query": query}
	if vars != nil {
		body["variables"] = vars
	}
	r := s.curl(t, http.MethodPost, "/graphql", []byte(mustJSON(t, body)), append([]string{hdrJSON, "Accept: application/json"}, headers...)...)
	g := &gqlResult{resp: r}
	if err := json.Unmarshal(r.Body, g); err != nil {
		t.Fatalf("%s: decoding the GraphQL answer: %v", r, err)
	}
	return g
}

// ok fails the test unless the answer is 200 without errors; it decodes data[field] into v.
func (g *gqlResult) ok(t *testing.T, field string, v any) {
	t.Helper()
	if g.resp.Status != http.StatusOK || len(g.Errors) > 0 {
		t.Fatalf("%s: got status %d and %d errors, want 200 without errors", g, g.resp.Status, len(g.Errors))
	}
	raw, ok := g.Data[field]
	if !ok {
		t.Fatalf("%s: got no data.%s", g, field)
	}
	if v != nil {
		if err := json.Unmarshal(raw, v); err != nil {
			t.Fatalf("%s: decoding data.%s: %v", g, field, err)
		}
	}
}

// wantCode reports (without stopping the test) unless the answer has HTTP status `status`
// (0: any status below 500) and its first error has extensions.code `code` and a message that
// mentions every one of mention.
func (g *gqlResult) wantCode(t *testing.T, status int, code string, mention ...string) {
	t.Helper()
	switch {
	case status != 0 && g.resp.Status != status:
		t.Errorf("%s: got status %d, want %d", g, g.resp.Status, status)
		return
	case status == 0 && g.resp.Status >= 500:
		t.Errorf("%s: got status %d, want an answer below 500", g, g.resp.Status)
		return
	case len(g.Errors) == 0:
		t.Errorf("%s: got no errors, want %s", g, code)
		return
	}
	e := g.Errors[0]
	if e.code() != code {
		t.Errorf("%s: got extensions.code %q, want %q", g, e.code(), code)
	}
	for _, m := range mention {
		if !strings.Contains(strings.ToLower(e.Message), strings.ToLower(m)) {
			t.Errorf("%s: got message %q, want it to mention %q", g, e.Message, m)
		}
	}
}

// ---- helpers ----

// eventually polls f until it reports done, failing the test after timeout with f's last word.
func eventually(t *testing.T, timeout time.Duration, what string, f func() (done bool, last string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done, last := f()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last: %s", what, timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// step runs one step of a flow as a subtest and ends the flow when the step fails.
func step(t *testing.T, name string, f func(t *testing.T)) {
	t.Helper()
	if !t.Run(name, f) {
		t.FailNow()
	}
}

// replicas starts n sandboxd processes on one real redis-server and one state folder.
func replicas(t *testing.T, redisURL string, n int) []*Server {
	t.Helper()
	return replicasWith(t, serverOptions{RedisURL: redisURL}, n)
}

// replicasWith starts n sandboxd processes with opts (its RedisURL a real redis-server) on one
// new state folder.
func replicasWith(t *testing.T, opts serverOptions, n int) []*Server {
	t.Helper()
	opts.State = newStateDir(t)
	out := make([]*Server, n)
	for i := range out {
		out[i] = startServer(t, opts)
	}
	return out
}
