package rest

import (
	"net/http"
	"strings"
	"testing"

	"sandboxd/internal/api/apitest"
)

func TestPauseAndResumeRoutes(t *testing.T) {
	f := apitest.New()
	h := newTestHandler(t, f)
	for _, tc := range []struct {
		verb, method, state string
	}{
		{"pause", "Pause", "PAUSED"},
		{"resume", "Resume", "RUNNING"},
	} {
		t.Run(tc.verb, func(t *testing.T) {
			rec := serve(t, h, http.MethodPost, Prefix+"/"+apitest.SandboxRunning+"/"+tc.verb, "")
			if rec.Code != http.StatusOK {
				t.Fatalf("got %d %s, want 200", rec.Code, rec.Body)
			}
			m := decodeObject(t, rec.Body.Bytes())
			if m["state"] != tc.state || m["sandbox_id"] != apitest.SandboxRunning || m["autostop_action"] == nil {
				t.Fatalf("got %v, want the sandbox %s with autostop_action", m, tc.state)
			}
			if c := f.Last(tc.method); c.SandboxID != apitest.SandboxRunning {
				t.Fatalf("the service got %+v, want %s of %s", c, tc.method, apitest.SandboxRunning)
			}
			// A body is refused (the verb takes none), another tenant's or an unknown id is
			// NOT_FOUND, the wrong method no route.
			if rec := serve(t, h, http.MethodPost, Prefix+"/"+apitest.SandboxRunning+"/"+tc.verb, `{"x":1}`); rec.Code != http.StatusBadRequest {
				t.Errorf("with a body: got %d, want 400", rec.Code)
			}
			if rec := serve(t, h, http.MethodPost, Prefix+"/sbx_someone_else/"+tc.verb, ""); rec.Code != http.StatusNotFound ||
				!strings.Contains(rec.Body.String(), `"NOT_FOUND"`) {
				t.Errorf("unknown id: got %d %s, want 404 NOT_FOUND", rec.Code, rec.Body)
			}
			if rec := serve(t, h, http.MethodPost, Prefix+"/"+apitest.SandboxBusy+"/"+tc.verb, ""); rec.Code != http.StatusConflict ||
				rec.Header().Get("Retry-After") == "" {
				t.Errorf("busy: got %d (Retry-After %q), want 409 with Retry-After", rec.Code, rec.Header().Get("Retry-After"))
			}
			if rec := serve(t, h, http.MethodGet, Prefix+"/"+apitest.SandboxRunning+"/"+tc.verb, ""); rec.Code == http.StatusOK {
				t.Errorf("GET %s: got 200, want no route", tc.verb)
			}
		})
	}
	// The create body carries autostop_action and auto_resume to the service.
	rec := serve(t, h, http.MethodPost, Prefix, `{"autostop_action":"pause","auto_resume":true}`)
	if rec.Code != http.StatusCreated {
		t.Fatalf("create: got %d %s", rec.Code, rec.Body)
	}
	if c := f.Last("Create"); c.Create.AutostopAction != "pause" || !c.Create.AutoResume {
		t.Fatalf("create request: got %+v, want autostop_action pause and auto_resume", c.Create)
	}
}
