package tests

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sandboxd/tests/e2e"
)

// TestChannelHijack is issue 13's critical finding, tried the way a hostile tenant would: a
// command in tenant 1's sandbox A points A's control channel at tenant 2's sandbox B and waits
// for the server to dial A again (a restart). Nothing of B may become reachable through A.
// Then the host side of A's channel is tampered with directly (as if the workload had got past
// the box's own defences): the server must refuse to talk to whatever answers there, report A
// FAILED with the reason, stop it, leave B alone, and start A again on request.
func TestChannelHijack(t *testing.T) {
	st := e2e.NewStateDir(t)
	s := e2e.StartServer(t, e2e.ServerOptions{State: st})
	a := s.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant1).SandboxID
	b := s.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant2).SandboxID
	s.Curl(t, http.MethodPut, e2e.Prefix+"/"+b+"/files?path=secret.txt", []byte("B-SECRET\n"), e2e.HdrTenant2).Want(t, http.StatusOK)
	s.Curl(t, http.MethodPut, e2e.Prefix+"/"+a+"/files?path=whoami", []byte(a+"\n"), e2e.HdrTenant1).Want(t, http.StatusOK)

	e2e.Step(t, "workload-redirects-its-channel", func(t *testing.T) {
		attack := `rm -f /run/sbx/host/init.sock && ln -s ../../` + b + `/host/init.sock /run/sbx/host/init.sock; echo "link:$?"
ls -A /run/sbx/host; echo "entries:$(ls -A /run/sbx/host | wc -l)"
echo junk > /run/sbx/host/fill; echo "fill:$?"`
		res := s.Exec(t, a, e2e.MustJSON(t, map[string]any{"command": []string{"bash", "-c", attack}, "timeout_sec": 60}), e2e.HdrTenant1)
		for _, want := range []string{"link:1", "entries:0", "fill:1"} {
			if !strings.Contains(res.Stdout, want) {
				t.Errorf("the attack printed %q (stderr %q), want %q: the host socket's folder must be out of reach", res.Stdout, res.Stderr, want)
			}
		}
	})

	// The server restarts, so its next call on A dials A's channel anew.
	s.Stop(t)
	s = e2e.StartServer(t, e2e.ServerOptions{State: st})
	s.Track(a, e2e.HdrTenant1)
	s.Track(b, e2e.HdrTenant2)

	e2e.Step(t, "A-reaches-only-A", func(t *testing.T) {
		res := s.Exec(t, a, `{"command":["sh","-c","cat whoami; cat /workspace/secret.txt"]}`, e2e.HdrTenant1)
		if strings.Contains(res.Stdout, "B-SECRET") || !strings.HasPrefix(res.Stdout, a+"\n") {
			t.Errorf("exec on A printed %q, want A's own whoami and no secret.txt", res.Stdout)
		}
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+a+"/files?path=secret.txt", nil, e2e.HdrTenant1).WantError(t, http.StatusNotFound, "NOT_FOUND")
		s.Curl(t, http.MethodPut, e2e.Prefix+"/"+a+"/files?path=planted.txt", []byte("from A"), e2e.HdrTenant1).Want(t, http.StatusOK)
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+b+"/files?path=planted.txt", nil, e2e.HdrTenant2).WantError(t, http.StatusNotFound, "NOT_FOUND")
	})

	// The host side, tampered with directly while no server runs: A's socket becomes a link
	// to B's.
	s.Stop(t)
	sock := filepath.Join(st.Dir, "boxes", a, "host", "init.sock")
	if err := os.Remove(sock); err != nil {
		t.Fatalf("A has no host socket: %v", err)
	}
	if err := os.Symlink("../../"+b+"/host/init.sock", sock); err != nil {
		t.Fatal(err)
	}
	s = e2e.StartServer(t, e2e.ServerOptions{State: st})
	s.Track(a, e2e.HdrTenant1)
	s.Track(b, e2e.HdrTenant2)

	e2e.Step(t, "tampered-box-fails", func(t *testing.T) {
		r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+a+"/exec", []byte(`{"command":["cat","/workspace/secret.txt"]}`), e2e.HdrJSON, e2e.HdrTenant1)
		// SANDBOX_FAILED naming the tampering, or INVALID_STATE when the reconciler saw it first.
		var e e2e.APIError
		if r.Status != http.StatusConflict || json.Unmarshal(r.Body, &e) != nil ||
			!(e.Error.Code == "SANDBOX_FAILED" && strings.Contains(e.Error.Message, "tampered") || e.Error.Code == "INVALID_STATE") {
			t.Errorf("%s: want 409 SANDBOX_FAILED naming the tampering", r)
		}
		if strings.Contains(string(r.Body), "B-SECRET") {
			t.Fatalf("A's exec answered B's secret: %s", r)
		}
		got := s.Get(t, a, e2e.HdrTenant1)
		if got.State != "FAILED" || !strings.Contains(got.StateReason, "tampered") {
			t.Errorf("A is %s (%q), want FAILED naming the tampering", got.State, got.StateReason)
		}
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+a+"/files?path=secret.txt", nil, e2e.HdrTenant1).WantError(t, http.StatusConflict, "INVALID_STATE")
	})

	e2e.Step(t, "B-untouched", func(t *testing.T) {
		if got := s.Get(t, b, e2e.HdrTenant2); got.State != "RUNNING" {
			t.Errorf("B is %s (%q), want RUNNING", got.State, got.StateReason)
		}
		if out := s.Run(t, b, []string{"cat", "secret.txt"}, e2e.HdrTenant2); out != "B-SECRET\n" {
			t.Errorf("B reads %q, want its secret", out)
		}
	})

	e2e.Step(t, "A-starts-again", func(t *testing.T) {
		r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+a+"/start", nil, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
		if out := s.Run(t, a, []string{"cat", "whoami", "planted.txt"}, e2e.HdrTenant1); out != a+"\nfrom A" {
			t.Errorf("A reads %q after the start, want its own workspace", out)
		}
		if target, err := os.Readlink(sock); err == nil {
			t.Errorf("A's host socket is still the planted link to %s", target)
		}
	})
}
