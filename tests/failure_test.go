package tests

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestSandboxDeath: a sandbox of the 64 MiB profile allocates 400 MiB; its gVisor sandbox dies.
// The waited exec answers 409 SANDBOX_FAILED naming the sandbox's state_reason (REST and
// GraphQL alike), the sandbox is then FAILED with that reason, the exec's stream still ends
// with an exit event carrying the error, exec on it is 409, and destroy still works.
func TestSandboxDeath(t *testing.T) {
	s := startServer(t, serverOptions{})
	sb := s.create(t, `{"profile":"tiny"}`, hdrTenant1)
	id := sb.SandboxID
	if sb.Resources.MemoryBytes != 64<<20 {
		t.Errorf("got memory_bytes %d, want 64 MiB", sb.Resources.MemoryBytes)
	}
	s.run(t, id, []string{"true"}, hdrTenant1)
	const oom = `x=bytearray(400<<20); print(len(x))`

	var failed struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			State   string `json:"state"`
			ExecID  string `json:"exec_id"`
		} `json:"error"`
	}
	step(t, "exec-that-kills-the-sandbox", func(t *testing.T) {
		start := time.Now()
		r := s.curl(t, http.MethodPost, prefix+"/"+id+"/exec",
			[]byte(`{"command":["sh","-c","echo before; sleep 1; python3 -c '`+oom+`'"],"timeout_sec":120}`), hdrJSON, hdrTenant1)
		t.Logf("%s (after %s)", r, time.Since(start).Round(time.Millisecond))
		r.wantError(t, http.StatusConflict, "SANDBOX_FAILED", "the sandbox failed")
		r.decode(t, &failed)
		if failed.Error.State != "FAILED" || !strings.HasPrefix(failed.Error.ExecID, "exec_") {
			t.Errorf("%s: got state %q exec_id %q, want FAILED and the exec's id", r, failed.Error.State, failed.Error.ExecID)
		}
	})

	step(t, "state-failed-with-reason", func(t *testing.T) {
		var last sandboxJSON
		eventually(t, 30*time.Second, "GET reports FAILED", func() (bool, string) {
			last = s.get(t, id, hdrTenant1)
			return last.State == "FAILED", mustJSON(t, last)
		})
		if last.StateReason == "" {
			t.Errorf("got %+v, want a non-empty state_reason", last)
		}
		t.Logf("state_reason: %q", last.StateReason)
		if !strings.Contains(failed.Error.Message, last.StateReason) {
			t.Errorf("the exec's error %q does not carry the state_reason %q", failed.Error.Message, last.StateReason)
		}
		var g gqlSandbox
		s.gql(t, gqlGet, map[string]any{"id": id}, hdrTenant1).ok(t, "sandbox", &g)
		if g.State != "FAILED" || g.StateReason == nil || *g.StateReason == "" {
			t.Errorf("GraphQL sandbox: got %+v, want FAILED with a stateReason", g)
		}
	})

	step(t, "exec-stream-ends-with-the-error", func(t *testing.T) {
		var st execStatusFull
		s.curl(t, http.MethodGet, prefix+"/"+id+"/execs/"+failed.Error.ExecID, nil, hdrTenant1).decode(t, &st)
		if st.State != "ENDED" || !strings.Contains(st.Error, "the sandbox failed") || st.Stdout != "before\n" {
			t.Errorf("exec status: got %+v, want ENDED with the sandbox's failure as error and the output", st)
		}
		resp := sseRequest(t, s, http.MethodGet, prefix+"/"+id+"/execs/"+failed.Error.ExecID+"/output", "", hdrTenant1)
		evs := readSSE(t, resp.Body)
		resp.Body.Close()
		if len(evs) == 0 || evs[len(evs)-1].event != "exit" || !strings.Contains(evs[len(evs)-1].data, "the sandbox failed") {
			t.Errorf("exec output: got %v, want an exit event carrying the error last", evs)
		}
	})

	step(t, "graphql-exec-that-kills-the-sandbox", func(t *testing.T) {
		other := s.create(t, `{"profile":"tiny"}`, hdrTenant1).SandboxID
		s.run(t, other, []string{"true"}, hdrTenant1)
		g := s.gql(t, gqlExec, map[string]any{"id": other, "in": map[string]any{"command": []string{"python3", "-c", oom}, "timeoutSec": 120}}, hdrTenant1)
		g.wantCode(t, 0, "SANDBOX_FAILED", "the sandbox failed")
		eventually(t, 30*time.Second, "GET reports FAILED", func() (bool, string) {
			last := s.get(t, other, hdrTenant1)
			return last.State == "FAILED", mustJSON(t, last)
		})
	})

	step(t, "exec-on-failed-is-409", func(t *testing.T) {
		r := s.curl(t, http.MethodPost, prefix+"/"+id+"/exec", []byte(`{"command":["true"]}`), hdrJSON, hdrTenant1)
		r.wantError(t, http.StatusConflict, "INVALID_STATE", "FAILED")
		r = s.curl(t, http.MethodGet, prefix+"/"+id+"/files?path=x", nil, hdrTenant1)
		r.wantError(t, http.StatusConflict, "INVALID_STATE")
	})

	step(t, "destroy", func(t *testing.T) {
		r := s.curl(t, http.MethodDelete, prefix+"/"+id, nil, hdrTenant1)
		r.want(t, http.StatusOK)
		s.curl(t, http.MethodGet, prefix+"/"+id, nil, hdrTenant1).wantError(t, http.StatusNotFound, "NOT_FOUND")
	})
}
