package rest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/apierror"
	"sandboxd/internal/execs"
	"sandboxd/internal/sandbox"
)

// execPath is a path under the fake's running sandbox's exec.
func execPath(execID, verb string) string {
	return Prefix + "/" + apitest.SandboxRunning + "/execs/" + execID + "/" + verb
}

func TestListExecsREST(t *testing.T) {
	f := apitest.New()
	h := newTestHandler(t, f)
	list := Prefix + "/" + apitest.SandboxRunning + "/execs"

	rec := serve(t, h, http.MethodGet, list, "")
	if rec.Code != http.StatusOK {
		t.Fatalf("got %d %s, want 200", rec.Code, rec.Body)
	}
	var out struct {
		Execs []map[string]any `json:"execs"`
		Next  *string          `json:"next_cursor"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Execs) != 2 || out.Execs[0]["exec_id"] != apitest.ExecRunning || out.Execs[1]["exec_id"] != apitest.ExecEnded || out.Next != nil {
		t.Fatalf("got %s, want the running exec, then the ended one, no next cursor", rec.Body)
	}
	running, ended := out.Execs[0], out.Execs[1]
	wantKeys(t, running, []string{"state", "command", "output_url", "status_url", "stdin_open", "started_at"},
		[]string{"stdout", "stderr", "exit_code", "ended_at", "tty"})
	wantKeys(t, ended, []string{"exit_code", "ended_at", "duration_ms"}, []string{"stdout", "stderr_truncated"})
	if running["state"] != "RUNNING" || running["stdin_open"] != false || ended["state"] != "ENDED" || ended["exit_code"] != 3.0 {
		t.Fatalf("got %v and %v", running, ended)
	}

	rec = serve(t, h, http.MethodGet, list+"?state=running&limit=1&cursor=exec_9", "")
	if rec.Code != http.StatusOK {
		t.Fatalf("got %d %s", rec.Code, rec.Body)
	}
	if got := f.Last("ListExecs").ExecList; got != (sandbox.ExecListOptions{State: "running", Limit: 1, After: "exec_9"}) {
		t.Fatalf("the service got %+v", got)
	}
	rec = serve(t, h, http.MethodGet, list+"?limit=1", "")
	if m := decodeObject(t, rec.Body.Bytes()); m["next_cursor"] != apitest.ExecRunning {
		t.Fatalf("a page of one: got %s, want next_cursor %s", rec.Body, apitest.ExecRunning)
	}
	for _, q := range []string{"?limit=0", "?limit=-3", "?limit=x", "?state=DONE"} {
		wantError(t, serve(t, h, http.MethodGet, list+q, ""), http.StatusBadRequest, "INVALID_ARGUMENT")
	}
	wantError(t, serve(t, h, http.MethodGet, Prefix+"/sbx_other/execs", ""), http.StatusNotFound, "NOT_FOUND")
	wantError(t, serve(t, h, http.MethodGet, list, "", "X-Api-Key", ""), http.StatusUnauthorized, "UNAUTHENTICATED")
}

func TestSignalExecREST(t *testing.T) {
	f := apitest.New()
	h := newTestHandler(t, f)
	rec := serve(t, h, http.MethodPost, execPath(apitest.ExecRunning, "signal"), `{"signal":"SIGTERM"}`)
	if rec.Code != http.StatusOK {
		t.Fatalf("got %d %s, want 200", rec.Code, rec.Body)
	}
	if m := decodeObject(t, rec.Body.Bytes()); m["exec_id"] != apitest.ExecRunning || m["state"] != "RUNNING" {
		t.Fatalf("got %v, want the exec's status", m)
	}
	if c := f.Last("SignalExec"); c.Signal != "SIGTERM" || c.SandboxID != apitest.SandboxRunning || c.ID != apitest.ExecRunning {
		t.Fatalf("the service got %+v", c)
	}
	rec = serve(t, h, http.MethodPost, execPath(apitest.ExecEnded, "signal"), `{"signal":"SIGKILL"}`)
	wantError(t, rec, http.StatusConflict, "INVALID_STATE")
	if m := decodeObject(t, rec.Body.Bytes()); m["error"].(map[string]any)["state"] != "ENDED" {
		t.Fatalf("got %s, want state ENDED in the error", rec.Body)
	}
	for _, body := range []string{``, `{}`, `{"signal":9}`, `{"signal":"SIGSTOP"}`, `{"sig":"SIGTERM"}`, `{"signal":"SIGTERM"}{}`} {
		wantError(t, serve(t, h, http.MethodPost, execPath(apitest.ExecRunning, "signal"), body), http.StatusBadRequest, "INVALID_ARGUMENT")
	}
	wantError(t, serve(t, h, http.MethodPost, Prefix+"/sbx_other/execs/"+apitest.ExecRunning+"/signal", `{"signal":"SIGTERM"}`),
		http.StatusNotFound, "NOT_FOUND")
	wantError(t, serve(t, h, http.MethodPost, execPath("exec_unknown", "signal"), `{"signal":"SIGTERM"}`), http.StatusNotFound, "NOT_FOUND")
}

func TestWriteStdinREST(t *testing.T) {
	f := apitest.New()
	h := newTestHandler(t, f)
	data := "line one\n\x00\xff binary\n"
	for _, ct := range []string{"", "application/octet-stream", "application/json", "text/plain"} {
		rec := serve(t, h, http.MethodPost, execPath(apitest.ExecRunning, "stdin"), data, "Content-Type", ct)
		if rec.Code != http.StatusOK {
			t.Fatalf("content type %q: got %d %s", ct, rec.Code, rec.Body)
		}
		m := decodeObject(t, rec.Body.Bytes())
		if m["written"] != float64(len(data)) || m["buffered"] != float64(len(data)) || m["closed"] != false {
			t.Fatalf("got %v", m)
		}
		if c := f.Last("WriteStdin"); string(c.Data) != data || c.Close {
			t.Fatalf("the service got %q close %v", c.Data, c.Close)
		}
	}
	for q, want := range map[string]bool{"?close=true": true, "?close=1": true, "?close=false": false, "?close=": false} {
		rec := serve(t, h, http.MethodPost, execPath(apitest.ExecRunning, "stdin")+q, "")
		if rec.Code != http.StatusOK || f.Last("WriteStdin").Close != want || len(f.Last("WriteStdin").Data) != 0 {
			t.Fatalf("%s: got %d %s, close %v", q, rec.Code, rec.Body, f.Last("WriteStdin").Close)
		}
	}
	calls := len(f.CallsTo("WriteStdin"))
	wantError(t, serve(t, h, http.MethodPost, execPath(apitest.ExecRunning, "stdin")+"?close=maybe", "x"), http.StatusBadRequest, "INVALID_ARGUMENT")
	big := strings.Repeat("x", execs.MaxStdinWrite+1)
	wantError(t, serve(t, h, http.MethodPost, execPath(apitest.ExecRunning, "stdin"), big), http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE")
	// Without a length the body is cut at the bound, and refused all the same.
	req := newRequest(t, t.Context(), http.MethodPost, "http://sandboxd"+execPath(apitest.ExecRunning, "stdin"), struct{ *strings.Reader }{strings.NewReader(big)})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	wantError(t, rec, http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE")
	if n := len(f.CallsTo("WriteStdin")); n != calls {
		t.Fatalf("refused writes reached the service: %d calls, want %d", n, calls)
	}
	// Exactly the bound is taken.
	if rec := serve(t, h, http.MethodPost, execPath(apitest.ExecRunning, "stdin"), big[1:]); rec.Code != http.StatusOK {
		t.Fatalf("a write of exactly %d bytes: got %d %s", execs.MaxStdinWrite, rec.Code, rec.Body)
	}

	wantError(t, serve(t, h, http.MethodPost, execPath(apitest.ExecEnded, "stdin"), "x"), http.StatusConflict, "INVALID_STATE")
	wantError(t, serve(t, h, http.MethodPost, Prefix+"/sbx_other/execs/"+apitest.ExecRunning+"/stdin", "x"), http.StatusNotFound, "NOT_FOUND")
	f.StdinErr = apierror.New(apierror.LimitExceeded, "the stdin buffer is full").WithDetail("limit_name", "stdin_buffer_bytes").
		WithRetryAfter(time.Second)
	rec = serve(t, h, http.MethodPost, execPath(apitest.ExecRunning, "stdin"), "x")
	wantError(t, rec, http.StatusTooManyRequests, "LIMIT_EXCEEDED")
	if rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("buffer full: got Retry-After %q, want 1", rec.Header().Get("Retry-After"))
	}
}

func TestResizeTtyREST(t *testing.T) {
	f := apitest.New()
	h := newTestHandler(t, f)
	rec := serve(t, h, http.MethodPost, execPath(apitest.ExecRunning, "resize"), `{"rows":50,"cols":132}`)
	if rec.Code != http.StatusOK {
		t.Fatalf("got %d %s", rec.Code, rec.Body)
	}
	m := decodeObject(t, rec.Body.Bytes())
	if tty, _ := m["tty"].(map[string]any); tty["rows"] != 50.0 || tty["cols"] != 132.0 || m["stdin_open"] != true {
		t.Fatalf("got %v, want tty 50x132 and stdin open", m)
	}
	if c := f.Last("ResizeTty"); c.Tty != (sandbox.TtySize{Rows: 50, Cols: 132}) {
		t.Fatalf("the service got %+v", c.Tty)
	}
	for _, body := range []string{``, `{"rows":"50"}`, `{"rows":50,"cols":132,"x":1}`, `{"rows":0,"cols":10}`, `[50,132]`} {
		wantError(t, serve(t, h, http.MethodPost, execPath(apitest.ExecRunning, "resize"), body), http.StatusBadRequest, "INVALID_ARGUMENT")
	}
	wantError(t, serve(t, h, http.MethodPost, execPath(apitest.ExecEnded, "resize"), `{"rows":5,"cols":5}`), http.StatusConflict, "INVALID_STATE")
}

// TestExecTtyAndStdinFields: the exec body's stdin_open and tty reach the service, and an exec
// status shows them; a waited answer without a terminal is as it always was.
func TestExecTtyAndStdinFields(t *testing.T) {
	f := apitest.New()
	h := newTestHandler(t, f)
	rec := serve(t, h, http.MethodPost, execURL, `{"command":["bash","-i"],"stdin_open":true,"tty":{"rows":24,"cols":80},"wait":false}`)
	if rec.Code != http.StatusAccepted {
		t.Fatalf("got %d %s", rec.Code, rec.Body)
	}
	if req := f.Last("Exec").Exec; !req.StdinOpen || req.Tty == nil || *req.Tty != (sandbox.TtySize{Rows: 24, Cols: 80}) {
		t.Fatalf("the service got %+v", req)
	}
	f.ExecResult = &sandbox.ExecResult{ExecID: "exec_9", SandboxID: apitest.SandboxRunning, State: sandbox.ExecRunning, StdinOpen: true,
		Tty: &sandbox.TtySize{Rows: 24, Cols: 80}}
	rec = serve(t, h, http.MethodPost, execURL, `{"command":["bash"],"wait":false}`)
	if !bytes.Contains(rec.Body.Bytes(), []byte(`"stdin_open":true,"tty":{"rows":24,"cols":80}`)) {
		t.Fatalf("got %s, want stdin_open and tty", rec.Body)
	}
	f.ExecResult = nil
	rec = serve(t, h, http.MethodPost, execURL, `{"command":["true"]}`)
	if bytes.Contains(rec.Body.Bytes(), []byte(`stdin_open`)) || bytes.Contains(rec.Body.Bytes(), []byte(`"tty"`)) {
		t.Fatalf("a waited answer without a terminal: got %s, want no stdin_open nor tty", rec.Body)
	}
	for _, body := range []string{`{"command":["x"],"tty":{"rows":"24"}}`, `{"command":["x"],"tty":[24,80]}`, `{"command":["x"],"stdin_open":"yes"}`} {
		wantError(t, serve(t, h, http.MethodPost, execURL, body), http.StatusBadRequest, "INVALID_ARGUMENT")
	}
}
