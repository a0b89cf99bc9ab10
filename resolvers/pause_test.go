package resolvers

import (
	"testing"

	"sandboxd/internal/api/apitest"
)

func TestPauseAndResumeSandbox(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	for _, tc := range []struct{ field, method, state string }{
		{"pauseSandbox", "Pause", "PAUSED"},
		{"resumeSandbox", "Resume", "RUNNING"},
	} {
		t.Run(tc.field, func(t *testing.T) {
			r := e.post(t, apitest.UserKey, `mutation { `+tc.field+`(id: "`+apitest.SandboxRunning+`") { sandbox { id state autostopAction autoResume } } }`, nil)
			noErrors(t, r)
			var sb struct {
				ID, State, AutostopAction string
				AutoResume                bool
			}
			field(t, r, tc.field+".sandbox", &sb)
			if sb.ID != apitest.SandboxRunning || sb.State != tc.state || sb.AutostopAction != "STOP" || sb.AutoResume {
				t.Errorf("got %+v, want %s with autostopAction STOP", sb, tc.state)
			}
			if c := e.fake.Last(tc.method); c.SandboxID != apitest.SandboxRunning {
				t.Errorf("the service got %+v", c)
			}
			// An unknown (or another tenant's) id is NOT_FOUND; one in flight INVALID_STATE with
			// retryAfter.
			r = e.post(t, apitest.UserKey, `mutation { `+tc.field+`(id: "sbx_nobody") { sandbox { id } } }`, nil)
			if r.code(0) != "NOT_FOUND" {
				t.Errorf("unknown id: got %+v, want NOT_FOUND", r.Errors)
			}
			r = e.post(t, apitest.UserKey, `mutation { `+tc.field+`(id: "`+apitest.SandboxBusy+`") { sandbox { id } } }`, nil)
			if r.code(0) != "INVALID_STATE" || r.Errors[0].Extensions["retryAfter"] == nil {
				t.Errorf("busy: got %+v, want INVALID_STATE with retryAfter", r.Errors)
			}
		})
	}
	r := e.post(t, apitest.UserKey, `mutation { createSandbox(input: {autostopAction: PAUSE, autoResume: true}) { sandbox { id } } }`, nil)
	noErrors(t, r)
	if req := e.fake.Last("Create").Create; req.AutostopAction != "pause" || !req.AutoResume {
		t.Errorf("create request: got %+v, want autostop_action pause and auto_resume", req)
	}
	r = e.post(t, apitest.UserKey, `mutation { createSandbox(input: {autostopAction: HIBERNATE}) { sandbox { id } } }`, nil)
	if len(r.Errors) == 0 {
		t.Errorf("an unknown autostopAction: got no error")
	}
}
