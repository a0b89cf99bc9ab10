package tests

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestChannelHijack is issue 13's critical finding, tried the way a hostile tenant would: a
// command in tenant 1's sandbox A points A's control channel at tenant 2's sandbox B and waits
// for the server to dial A again (a restart). Nothing of B may become reachable through A.
// Then the host side of A's channel is tampered with directly (as if the workload had got past
// the box's own defences): the server must refuse to talk to whatever answers there, report A
// FAILED with the reason, stop it, leave B alone, and start A again on request.
func TestChannelHijack(t *testing.T) {
	st := newStateDir(t)
	s := startServer(t, serverOptions{State: st})
	a := s.create(t, `{"profile":"sandboxes-default"}`, hdrTenant1).SandboxID
	b := s.create(t, `{"profile":"sandboxes-default"}`, hdrTenant2).SandboxID
	s.curl(t, http.MethodPut, prefix+"/"+b+"/files?path=secret.txt", []byte("B-SECRET\n"), hdrTenant2).want(t, http.StatusOK)
	s.curl(t, http.MethodPut, prefix+"/"+a+"/files?path=whoami", []byte(a+"\n"), hdrTenant1).want(t, http.StatusOK)

	step(t, "workload-redirects-its-channel", func(t *testing.T) {
		attack := `rm -f /run/sbx/host/init.sock && ln -s ../../` + b + `/host/init.sock /run/sbx/host/init.sock; echo "link:$?"
ls -A /run/sbx/host; echo "entries:$(ls -A /run/sbx/host | wc -l)"
echo junk > /run/sbx/host/fill; echo "fill:$?"`
		res := s.exec(t, a, mustJSON(t, map[string]any{"command": []string{"bash", "-c", attack}, "timeout_sec": 60}), hdrTenant1)
		for _, want := range []string{"link:1", "entries:0", "fill:1"} {
			if !strings.Contains(res.Stdout, want) {
				t.Errorf("the attack printed %q (stderr %q), want %q: the host socket's folder must be out of reach", res.Stdout, res.Stderr, want)
			}
		}
	})

	// The server restarts, so its next call on A dials A's channel anew.
	s.Stop(t)
	s = startServer(t, serverOptions{State: st})
	s.track(a, hdrTenant1)
	s.track(b, hdrTenant2)

	step(t, "A-reaches-only-A", func(t *testing.T) {
		res := s.exec(t, a, `{"command":["sh","-c","cat whoami; cat /workspace/secret.txt"]}`, hdrTenant1)
		if strings.Contains(res.Stdout, "B-SECRET") || !strings.HasPrefix(res.Stdout, a+"\n") {
			t.Errorf("exec on A printed %q, want A's own whoami and no secret.txt", res.Stdout)
		}
		s.curl(t, http.MethodGet, prefix+"/"+a+"/files?path=secret.txt", nil, hdrTenant1).wantError(t, http.StatusNotFound, "NOT_FOUND")
		s.curl(t, http.MethodPut, prefix+"/"+a+"/files?path=planted.txt", []byte("from A"), hdrTenant1).want(t, http.StatusOK)
		s.curl(t, http.MethodGet, prefix+"/"+b+"/files?path=planted.txt", nil, hdrTenant2).wantError(t, http.StatusNotFound, "NOT_FOUND")
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
	s = startServer(t, serverOptions{State: st})
	s.track(a, hdrTenant1)
	s.track(b, hdrTenant2)

	step(t, "tampered-box-fails", func(t *testing.T) {
		r := s.curl(t, http.MethodPost, prefix+"/"+a+"/exec", []byte(`{"command":["cat","/workspace/secret.txt"]}`), hdrJSON, hdrTenant1)
		// SANDBOX_FAILED naming the tampering, or INVALID_STATE when the reconciler saw it first.
		var e apiError
		if r.Status != http.StatusConflict || json.Unmarshal(r.Body, &e) != nil ||
			!(e.Error.Code == "SANDBOX_FAILED" && strings.Contains(e.Error.Message, "tampered") || e.Error.Code == "INVALID_STATE") {
			t.Errorf("%s: want 409 SANDBOX_FAILED naming the tampering", r)
		}
		if strings.Contains(string(r.Body), "B-SECRET") {
			t.Fatalf("A's exec answered B's secret: %s", r)
		}
		got := s.get(t, a, hdrTenant1)
		if got.State != "FAILED" || !strings.Contains(got.StateReason, "tampered") {
			t.Errorf("A is %s (%q), want FAILED naming the tampering", got.State, got.StateReason)
		}
		s.curl(t, http.MethodGet, prefix+"/"+a+"/files?path=secret.txt", nil, hdrTenant1).wantError(t, http.StatusConflict, "INVALID_STATE")
	})

	step(t, "B-untouched", func(t *testing.T) {
		if got := s.get(t, b, hdrTenant2); got.State != "RUNNING" {
			t.Errorf("B is %s (%q), want RUNNING", got.State, got.StateReason)
		}
		if out := s.run(t, b, []string{"cat", "secret.txt"}, hdrTenant2); out != "B-SECRET\n" {
			t.Errorf("B reads %q, want its secret", out)
		}
	})

	step(t, "A-starts-again", func(t *testing.T) {
		r := s.curl(t, http.MethodPost, prefix+"/"+a+"/start", nil, hdrTenant1)
		r.want(t, http.StatusOK)
		if out := s.run(t, a, []string{"cat", "whoami", "planted.txt"}, hdrTenant1); out != a+"\nfrom A" {
			t.Errorf("A reads %q after the start, want its own workspace", out)
		}
		if target, err := os.Readlink(sock); err == nil {
			t.Errorf("A's host socket is still the planted link to %s", target)
		}
	})
}
