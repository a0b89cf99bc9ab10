package tests

import (
	"net/http"
	"testing"
	"time"
)

// TestFirstCallAfterAnIdleStart: the attach that proved a started box ready is kept for the
// first call only briefly; a call that comes after the sandbox sat idle (past the guest's
// 10 s wait for a connection's first request) still works on the first try.
func TestFirstCallAfterAnIdleStart(t *testing.T) {
	s := startServer(t, serverOptions{})
	id := s.create(t, `{"profile":"sandboxes-default"}`, hdrTenant1).SandboxID
	s.curl(t, http.MethodPost, prefix+"/"+id+"/stop", nil, hdrTenant1).want(t, http.StatusOK)
	s.curl(t, http.MethodPost, prefix+"/"+id+"/start", nil, hdrTenant1).want(t, http.StatusOK)
	time.Sleep(12 * time.Second)
	r := s.curl(t, http.MethodPost, prefix+"/"+id+"/exec", []byte(`{"command":["echo","awake"]}`), hdrJSON, hdrTenant1)
	r.want(t, http.StatusOK)
	var res execJSON
	r.decode(t, &res)
	if res.Stdout != "awake\n" {
		t.Fatalf("exec after an idle start: got %q", res.Stdout)
	}
}
