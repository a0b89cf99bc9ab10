package tests

import (
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"sandboxd/internal/version"
	"sandboxd/tests/e2e"
)

// TestVersionAndPprof: `sandboxd version` and `--version` print the version, a revision and
// the Go version; /readyz and /metrics (sandboxd_build_info) carry the same; pprof_addr serves
// Go's profiles on its own loopback listener while the API's listener serves none of them, even
// with a key; a pprof_addr that is not loopback stops sandboxd before it starts.
func TestVersionAndPprof(t *testing.T) {
	e2e.RequireComponents(t)
	want := regexp.MustCompile(`^sandboxd ` + regexp.QuoteMeta(version.Version) + ` \(revision (\S+), go[0-9.]+\S* linux/\w+\)\n$`)
	var revision string
	for _, arg := range []string{"version", "--version", "-version"} {
		out, err := exec.Command(e2e.Sandboxd(), arg).Output()
		m := want.FindStringSubmatch(string(out))
		if err != nil || m == nil {
			t.Fatalf("sandboxd %s: got %q, %v; want %s", arg, out, err, want)
		}
		revision = m[1]
	}

	pprofAddr := e2e.FreeAddr(t)
	s := e2e.StartServer(t, e2e.ServerOptions{Extra: map[string]any{"pprof_addr": pprofAddr}})
	e2e.Step(t, "readyz", func(t *testing.T) {
		r := s.Curl(t, http.MethodGet, "/readyz", nil)
		r.Want(t, http.StatusOK)
		line := fmt.Sprintf("version %s revision %s go", version.Version, revision)
		if !strings.HasPrefix(string(r.Body), "ready\n") || !strings.Contains(string(r.Body), line) {
			t.Errorf("/readyz: got %q, want ready and %q…", r.Body, line)
		}
	})
	e2e.Step(t, "build-info", func(t *testing.T) {
		r := s.Curl(t, http.MethodGet, "/metrics", nil)
		r.Want(t, http.StatusOK)
		series := regexp.MustCompile(`(?m)^sandboxd_build_info\{goversion="go[^"]+",revision="` + regexp.QuoteMeta(revision) +
			`",version="` + regexp.QuoteMeta(version.Version) + `"\} 1$`)
		if !series.Match(r.Body) {
			t.Errorf("/metrics: got no sandboxd_build_info{…,revision=%q,version=%q} 1", revision, version.Version)
		}
	})
	e2e.Step(t, "pprof", func(t *testing.T) {
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/debug/pprof/heap?debug=1"} {
			resp, err := http.Get("http://" + pprofAddr + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || len(body) == 0 {
				t.Errorf("pprof %s: got %d, %d bytes; want 200 with a profile", path, resp.StatusCode, len(body))
			}
		}
		// The API's listener: no profile for anyone, keyed or not.
		for _, hdrs := range [][]string{nil, {e2e.HdrDev}} {
			r := s.Curl(t, http.MethodGet, "/debug/pprof/goroutine?debug=1", nil, hdrs...)
			if r.Status == http.StatusOK || strings.Contains(string(r.Body), "goroutine") {
				t.Errorf("API listener /debug/pprof/ with headers %v: got %d %q, want no profile", hdrs, r.Status, r.Body)
			}
		}
	})
	e2e.Step(t, "pprof-not-loopback", func(t *testing.T) {
		for _, addr := range []string{"0.0.0.0:0", ":6060", "[::]:6060"} {
			cmd := exec.Command(e2e.Sandboxd(), "--pprof-addr", addr, "--runsc", "/bin/true", "--init-binary", "/bin/true",
				"--rootfs", "/", "--state-dir", t.TempDir())
			cmd.Env = []string{"SANDBOX_API_KEY=a-long-dev-key", "PATH=/usr/bin:/bin"}
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), "must be a loopback address") {
				t.Errorf("sandboxd --pprof-addr %s: got %v %q, want it refused with the loopback rule", addr, err, out)
			}
		}
	})
}
