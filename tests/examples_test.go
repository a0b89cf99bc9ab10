package tests

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sandboxd/tests/e2e"
)

// TestExampleExecStream builds examples/exec-stream and runs it the way its doc comment says:
// a command started with wait: false and followed to its end over a GraphQL WebSocket, then the
// same exec reattached by id. Output is byte for byte the command's; the exit code is its own.
func TestExampleExecStream(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	id := s.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant1).SandboxID
	bin := filepath.Join(t.TempDir(), "exec-stream")
	build := exec.Command("go", "build", "-o", bin, "./examples/exec-stream")
	build.Dir = e2e.ModuleRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the example: %v\n%s", err, out)
	}
	run := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"-url", "ws://" + s.Addr + "/graphql"}, args...)...)
		cmd.Env = append(os.Environ(), "SANDBOX_API_KEY="+e2e.KeyTenant1)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			code = ee.ExitCode()
		case err != nil:
			t.Fatalf("running the example: %v", err)
		}
		return o.String(), e.String(), code
	}
	stdout, stderr, code := run("-sandbox", id, "--", "sh", "-c", "seq 1 20000; echo oops >&2; exit 3")
	if stdout != seqOutput(20000) || !strings.Contains(stderr, "oops\n") || code != 3 {
		t.Fatalf("example: %d stdout bytes, stderr %q, exit %d; want seq 1 20000, oops, 3", len(stdout), stderr, code)
	}
	_, execID, ok := strings.Cut(strings.SplitN(stderr, "\n", 2)[0], "started ")
	if !ok {
		t.Fatalf("the example did not say which exec it started: %q", stderr)
	}
	again, _, code := run("-exec", strings.TrimSpace(execID))
	if again != stdout || code != 3 {
		t.Fatalf("reattached: %d bytes, exit %d", len(again), code)
	}
	if _, stderr, code := run("-exec", "exec_01ARZ3NDEKTSV4RRFFQ69G5FAV"); code != 1 || !strings.Contains(stderr, "NOT_FOUND") {
		t.Fatalf("an unknown exec: exit %d, stderr %q", code, stderr)
	}
}
