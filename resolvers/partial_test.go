package resolvers

import (
	"testing"

	"sandboxd/internal/api/apitest"
)

// TestPartialAnswers: root fields are nullable, so one failing field is null with its error
// and the others keep their answers (a dashboard page is not blanked by one bad panel).
func TestPartialAnswers(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	tests := []struct {
		name, query string
		ok, failed  string
		wantCode    string
	}{
		{"two-stops", `mutation($a: ID!, $b: ID!) { a: stopSandbox(id: $a) { sandbox { id state } } b: stopSandbox(id: $b) { sandbox { id state } } }`,
			"a", "b", "INVALID_STATE"},
		{"files-beside-a-sandbox", `query($a: ID!, $b: ID!) { a: sandbox(id: $a) { id } b: listFiles(sandboxId: $b) { path } }`,
			"a", "b", "INVALID_STATE"},
		{"read-beside-quota", `query($a: ID!, $b: ID!) { q: quota { limit } a: stat(sandboxId: $a, path: "x") { path } b: readFile(sandboxId: $b, path: "x") { size } }`,
			"q", "b", "INVALID_STATE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.post(t, apitest.UserKey, tt.query, map[string]any{"a": apitest.SandboxRunning, "b": apitest.SandboxBusy})
			if got := string(r.Data[tt.ok]); got == "" || got == "null" {
				t.Errorf("%s: got %q, want its answer kept", tt.ok, got)
			}
			if got := string(r.Data[tt.failed]); got != "null" {
				t.Errorf("%s: got %q, want null", tt.failed, got)
			}
			found := false
			for i := range r.Errors {
				if len(r.Errors[i].Path) == 1 && r.Errors[i].Path[0] == tt.failed && r.code(i) == tt.wantCode {
					found = true
				}
			}
			if !found {
				t.Errorf("got errors %+v, want %s on %s", r.Errors, tt.wantCode, tt.failed)
			}
		})
	}
}
