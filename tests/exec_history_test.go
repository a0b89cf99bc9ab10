package tests

import (
	"net/http"
	"testing"

	"sandboxd/tests/e2e"
)

// TestExecHistoryDoesNotFillTheSandbox: the guest init keeps the output logs of ended execs in
// a tmpfs that the sandbox's memory limit counts. A workload that runs command after command
// with large output (here 16 × 32 MiB in a 384 MiB sandbox, what the stream benchmark did to
// a 1 GiB one) must not be OOM-killed by that history: the sandbox stays RUNNING with its
// workspace, and each exec's result is whole.
func TestExecHistoryDoesNotFillTheSandbox(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{Extra: map[string]any{
		"profiles": []map[string]any{
			{"name": "sandboxes-default", "rootfs": e2e.Rootfs(), "milli_cpu": 1000, "memory_mb": 384},
		},
	}})
	key := e2e.HdrTenant1
	id := s.Create(t, e2e.CreateBody, key).SandboxID
	s.Run(t, id, []string{"sh", "-c", "echo kept > kept.txt"}, key)
	const mib32 = 32 << 20
	for i := range 16 {
		body := e2e.MustJSON(t, map[string]any{"command": []string{"head", "-c", "33554432", "/dev/zero"}, "timeout_sec": 120})
		r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/exec", []byte(body), e2e.HdrJSON, key)
		if r.Status != http.StatusOK {
			t.Fatalf("exec %d: %s", i, r)
		}
		var res e2e.ExecJSON
		r.Decode(t, &res)
		if res.ExitCode != 0 || res.Error != "" || res.Signal != "" {
			t.Fatalf("exec %d of 32 MiB: exit %d signal %q error %q, want exit 0 (the sandbox: %s)",
				i, res.ExitCode, res.Signal, res.Error, s.Get(t, id, key).State)
		}
		if n := len(res.Stdout); !res.StdoutTruncated && n != mib32 {
			t.Fatalf("exec %d: %d bytes of stdout, not truncated, want %d", i, n, mib32)
		}
	}
	if got := s.Get(t, id, key); got.State != "RUNNING" {
		t.Fatalf("after 16 execs of 32 MiB: %s %q, want RUNNING", got.State, got.StateReason)
	}
	if out := s.Run(t, id, []string{"cat", "kept.txt"}, key); out != "kept\n" {
		t.Fatalf("kept.txt: %q, want kept", out)
	}
}
