package tests

import (
	"net/http"
	"testing"
	"time"

	"sandboxd/tests/e2e"
)

// TestFirstCallAfterAnIdleStart: the attach that proved a started box ready is kept for the
// first call only briefly; a call that comes after the sandbox sat idle (past the guest's
// 10 s wait for a connection's first request) still works on the first try.
func TestFirstCallAfterAnIdleStart(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	id := s.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant1).SandboxID
	s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/stop", nil, e2e.HdrTenant1).Want(t, http.StatusOK)
	s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/start", nil, e2e.HdrTenant1).Want(t, http.StatusOK)
	time.Sleep(12 * time.Second)
	r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/exec", []byte(`{"command":["echo","awake"]}`), e2e.HdrJSON, e2e.HdrTenant1)
	r.Want(t, http.StatusOK)
	var res e2e.ExecJSON
	r.Decode(t, &res)
	if res.Stdout != "awake\n" {
		t.Fatalf("exec after an idle start: got %q", res.Stdout)
	}
}
