package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"sandboxd/internal/auth"
	"sandboxd/internal/rest/openapitest"
	"sandboxd/internal/source/sourcetest"
)

// ServerOptions configure one sandboxd process.
type ServerOptions struct {
	// State is the state folder; nil makes a new one.
	State *StateDir
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
	State *StateDir

	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	waitErr error
	client  *http.Client

	// t is the test that started the server; spec its OpenAPI document (openapi.go), against
	// which the REST traffic is checked; violations are the mismatches so far, each reported
	// on t while checksDone is false.
	t          testing.TB
	spec       *openapitest.Spec
	violations []string
	checksDone bool
	// gateway is the checked reverse proxy that sandboxctl runs use (openapi.go).
	gateway *httptest.Server

	mu      sync.Mutex
	stopped bool
	// tracked are the sandboxes to destroy when the test ends, with the headers to do it.
	tracked map[string][]string
}

var serverSeq struct {
	sync.Mutex
	n int
}

// StartServer starts sandboxd and waits until /readyz answers 200. The server is stopped (with
// SIGTERM, then SIGKILL) when the test ends, after the sandboxes it tracks are destroyed; its log
// goes to the test log when the test failed.
func StartServer(t *testing.T, opts ServerOptions) *Server {
	t.Helper()
	RequireComponents(t)
	if opts.State == nil {
		opts.State = NewStateDir(t)
	}
	serverSeq.Lock()
	serverSeq.n++
	n := serverSeq.n
	serverSeq.Unlock()
	name := fmt.Sprintf("%s-%d", strings.NewReplacer("/", "_").Replace(t.Name()), n)
	addr := FreeAddr(t)
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
		client: &http.Client{Timeout: 10 * time.Minute}, tracked: map[string][]string{}, t: t}
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
		s.mu.Lock()
		s.checksDone = true
		s.mu.Unlock()
	})
	s.waitReady(t)
	spec, err := s.loadSpec()
	if err != nil {
		t.Fatal(err)
	}
	s.spec = spec
	s.client.Transport = s.Transport(nil)
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
	return append(env, "SANDBOX_API_KEY="+KeyDev)
}

// writeConfig writes the server's YAML config: the test keys, the profiles, the limits, no
// concurrency limit (quota.default_limit 0) and opts.Extra.
func writeConfig(t *testing.T, path string, opts ServerOptions) {
	t.Helper()
	cfg := map[string]any{
		"api_keys": []map[string]any{
			{"name": "tenant1", "sha256": auth.HashKey(KeyTenant1), "tenant": "t1", "project": "p1"},
			{"name": "tenant2", "sha256": auth.HashKey(KeyTenant2), "tenant": "t2", "project": "p1"},
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

// ArchiveHost starts an HTTPS server on loopback (sourcetest.Server: a certificate of its own,
// requests counted per path) for sandboxd to fetch source.archive_url from, and returns it with
// the config section that lets it: sources.allow_hosts names its host:port (loopback is refused
// otherwise) and sources.ca_file its certificate, written into the suite's folder. Add further
// sources keys to the map before passing it as ServerOptions.Extra["sources"].
func ArchiveHost(t *testing.T) (*sourcetest.Server, map[string]any) {
	t.Helper()
	srv := sourcetest.NewServer(t)
	return srv, map[string]any{
		"allow_hosts": []string{srv.Host()},
		"ca_file":     srv.WriteCA(t, suite.root),
	}
}

// FreeAddr returns a loopback address with a port that was free a moment ago.
func FreeAddr(t *testing.T) string {
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

// PID is the process id of the server.
func (s *Server) PID() int { return s.cmd.Process.Pid }

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

// LogLines returns the lines of the server's log so far that hold sub.
func (s *Server) LogLines(sub string) []string {
	data, _ := os.ReadFile(s.logPath)
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}

// LogContains reports whether the server's log so far holds sub.
func (s *Server) LogContains(sub string) bool {
	data, err := os.ReadFile(s.logPath)
	return err == nil && strings.Contains(string(data), sub)
}

func (s *Server) dumpLog(t *testing.T) {
	t.Logf("sandboxd %s log (%s):\n%s", s.name, s.logPath, s.logTail(400))
}

// Track registers a sandbox to destroy (with these headers) when the test ends.
func (s *Server) Track(id string, headers ...string) {
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
			r, err := s.Send(http.MethodDelete, Prefix+"/"+id, nil, headers...)
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
