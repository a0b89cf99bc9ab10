package rest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/apierror"
	"sandboxd/internal/sandbox"
)

// execURL is the exec path of the fake's running sandbox.
const execURL = Prefix + "/" + apitest.SandboxRunning + "/exec"

// legacyExecOut and legacyExecJSON are the waited exec answer as it was before exec
// streaming: the answer must still start with exactly these bytes.
type legacyExecOut struct {
	ExecID          string    `json:"exec_id"`
	ExitCode        int       `json:"exit_code"`
	Signal          string    `json:"signal,omitempty"`
	Stdout          string    `json:"stdout"`
	Stderr          string    `json:"stderr"`
	StdoutBase64    string    `json:"stdout_base64,omitempty"`
	StderrBase64    string    `json:"stderr_base64,omitempty"`
	TimedOut        bool      `json:"timed_out"`
	DurationMs      int64     `json:"duration_ms"`
	DurationSec     float64   `json:"duration_sec"`
	StdoutTruncated bool      `json:"stdout_truncated"`
	StderrTruncated bool      `json:"stderr_truncated"`
	StartedAt       time.Time `json:"started_at"`
	EndedAt         time.Time `json:"ended_at"`
	Error           string    `json:"error,omitempty"`
}

func legacyExecJSON(res sandbox.ExecResult) legacyExecOut {
	out := legacyExecOut{ExecID: res.ExecID, ExitCode: res.ExitCode, Signal: res.Signal, TimedOut: res.TimedOut,
		Stdout: string(res.Stdout), Stderr: string(res.Stderr),
		DurationMs: res.Duration.Milliseconds(), DurationSec: res.Duration.Seconds(),
		StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
		StartedAt: res.StartedAt, EndedAt: res.EndedAt, Error: res.Error}
	if !utf8.Valid(res.Stdout) {
		out.StdoutBase64 = base64.StdEncoding.EncodeToString(res.Stdout)
	}
	if !utf8.Valid(res.Stderr) {
		out.StderrBase64 = base64.StdEncoding.EncodeToString(res.Stderr)
	}
	return out
}

func serve(t *testing.T, h http.Handler, method, path, body string, headers ...string) *httptest.ResponseRecorder {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := newRequest(t, context.Background(), method, path, rd, headers...)
	if req.Body == nil {
		req.Body = http.NoBody // as a server's request always has one
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// decodeObject decodes a JSON object answer.
func decodeObject(t *testing.T, body []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("got %q, want a JSON object: %v", body, err)
	}
	return m
}

func wantKeys(t *testing.T, m map[string]any, present, absent []string) {
	t.Helper()
	for _, k := range present {
		if _, ok := m[k]; !ok {
			t.Errorf("got no %q in %v, want it", k, m)
		}
	}
	for _, k := range absent {
		if v, ok := m[k]; ok {
			t.Errorf("got %q = %v, want it absent", k, v)
		}
	}
}

func TestExecWaitedAnswerUnchanged(t *testing.T) {
	base := sandbox.ExecResult{ExecID: "exec_1", SandboxID: apitest.SandboxRunning, Command: "echo hi", State: sandbox.ExecEnded,
		Duration: 54 * time.Millisecond, StartedAt: apitest.T0, EndedAt: t1, Stdout: []byte("hi\n"), OutputBytes: 3}
	cases := []struct {
		name string
		edit func(*sandbox.ExecResult)
	}{
		{name: "ok", edit: func(*sandbox.ExecResult) {}},
		{name: "failed-with-stderr", edit: func(r *sandbox.ExecResult) { r.ExitCode, r.Stderr = 1, []byte("boom\n") }},
		{name: "killed", edit: func(r *sandbox.ExecResult) { r.ExitCode, r.Signal, r.TimedOut = 137, "SIGKILL", true }},
		{name: "binary-output", edit: func(r *sandbox.ExecResult) { r.Stdout, r.Stderr = []byte{0xff, 0, 1}, []byte{0xc3} }},
		{name: "truncated", edit: func(r *sandbox.ExecResult) { r.StdoutTruncated, r.StderrTruncated = true, true }},
		{name: "could-not-start", edit: func(r *sandbox.ExecResult) { r.ExitCode, r.Error, r.Stdout = 127, "no such program", nil }},
		{name: "zero-times", edit: func(r *sandbox.ExecResult) { r.StartedAt, r.EndedAt, r.Duration = time.Time{}, time.Time{}, 0 }},
		{name: "no-state-from-service", edit: func(r *sandbox.ExecResult) { r.State, r.SandboxID = "", "" }},
		{name: "html-characters", edit: func(r *sandbox.ExecResult) { r.Stdout = []byte("<a href='x'>&</a>\n") }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := apitest.New()
			res := base
			c.edit(&res)
			f.ExecResult = &res
			rec := serve(t, newTestHandler(t, f), http.MethodPost, execURL, `{"command":["echo","hi"]}`)
			if rec.Code != http.StatusOK {
				t.Fatalf("got status %d, want 200: %s", rec.Code, rec.Body)
			}
			var want bytes.Buffer
			enc := json.NewEncoder(&want)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(legacyExecJSON(res)); err != nil {
				t.Fatal(err)
			}
			wantBody := strings.TrimSuffix(want.String(), "}\n") + `,"sandbox_id":"` + apitest.SandboxRunning + `","state":"ENDED"}` + "\n"
			if got := rec.Body.String(); got != wantBody {
				t.Errorf("got\n%s\nwant\n%s", got, wantBody)
			}
			if got := rec.Header().Get("Content-Type"); got != "application/json" {
				t.Errorf("got Content-Type %q, want application/json", got)
			}
			reqs, _ := execCalls(f)
			if len(reqs) != 1 || reqs[0].Detach {
				t.Errorf("got exec requests %+v, want one that waits", reqs)
			}
		})
	}
	t.Run("golden", func(t *testing.T) {
		f := apitest.New()
		f.ExecResult = &base
		rec := serve(t, newTestHandler(t, f), http.MethodPost, execURL, `{"command":["echo","hi"],"wait":true}`)
		want := `{"exec_id":"exec_1","exit_code":0,"stdout":"hi\n","stderr":"","timed_out":false,"duration_ms":54,` +
			`"duration_sec":0.054,"stdout_truncated":false,"stderr_truncated":false,"started_at":"2025-01-02T03:04:05Z",` +
			`"ended_at":"2025-01-02T03:04:05.054Z","sandbox_id":"` + apitest.SandboxRunning + `","state":"ENDED"}` + "\n"
		if got := rec.Body.String(); got != want {
			t.Errorf("got\n%s\nwant\n%s", got, want)
		}
	})
}

func TestExecNoWait(t *testing.T) {
	f := apitest.New()
	f.ExecResult = &sandbox.ExecResult{ExecID: "exec_2", SandboxID: apitest.SandboxRunning, Command: "sleep 60", State: sandbox.ExecRunning, StartedAt: apitest.T0}
	rec := serve(t, newTestHandler(t, f), http.MethodPost, execURL, `{"command":["sleep","60"],"wait":false}`)
	if rec.Code != http.StatusAccepted {
		t.Fatalf("got status %d, want 202: %s", rec.Code, rec.Body)
	}
	status := Prefix + "/" + apitest.SandboxRunning + "/execs/exec_2"
	if got := rec.Header().Get("Location"); got != status {
		t.Errorf("got Location %q, want %q", got, status)
	}
	m := decodeObject(t, rec.Body.Bytes())
	want := map[string]any{"exec_id": "exec_2", "sandbox_id": apitest.SandboxRunning, "command": "sleep 60", "state": "RUNNING",
		"started_at": "2025-01-02T03:04:05Z", "output_bytes": 0.0, "status_url": status, "output_url": status + "/output"}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("got %s = %v, want %v", k, m[k], v)
		}
	}
	wantKeys(t, m, nil, []string{"exit_code", "signal", "timed_out", "duration_ms", "duration_sec", "ended_at", "error",
		"stdout", "stderr", "stdout_truncated", "stderr_truncated"})
	reqs, _ := execCalls(f)
	if len(reqs) != 1 || !reqs[0].Detach || !slices.Equal(reqs[0].Command, []string{"sleep", "60"}) {
		t.Errorf("got exec requests %+v, want one detached sleep 60", reqs)
	}
}

// streamFixture is an exec with a little of everything in its output.
func streamFixture() (*apitest.Fake, sandbox.ExecResult) {
	f := apitest.New()
	running := sandbox.ExecResult{ExecID: "exec_3", SandboxID: apitest.SandboxRunning, Command: "make", State: sandbox.ExecRunning, StartedAt: apitest.T0}
	ended := running
	ended.State, ended.ExitCode, ended.Duration, ended.EndedAt, ended.OutputBytes = sandbox.ExecEnded, 2, 54*time.Millisecond, t1, 20
	f.ExecResult = &running
	f.Execs["exec_3"] = running
	f.ExecEvents["exec_3"] = []sandbox.ExecEvent{
		{Kind: sandbox.ExecChunk, Cursor: "c1", Stream: "stdout", Data: []byte("hello \"world\"\n")},
		{Kind: sandbox.ExecChunk, Cursor: "c2", Stream: "stderr", Data: []byte{0xff, 0xfe}},
		{Kind: sandbox.ExecTruncated, Cursor: "c3", MissedBytes: 10},
		{Kind: sandbox.ExecChunk, Cursor: "c4", Stream: "stdout", Data: []byte("line\r\nlast\u2028")},
		{Kind: sandbox.ExecExit, Cursor: "c5", Result: &ended},
	}
	return f, ended
}

// wantStream checks events against the fixture's, from the one after cursor after.
func wantStream(t *testing.T, got []sseEvent, after string) {
	t.Helper()
	all := []sseEvent{
		{ID: "c1", Event: "chunk", Data: `{"stream":"stdout","data":"hello \"world\"\n"}`},
		{ID: "c2", Event: "chunk", Data: `{"stream":"stderr","data_base64":"//4="}`},
		{ID: "c3", Event: "truncated", Data: `{"missed_bytes":10}`},
		{ID: "c4", Event: "chunk", Data: `{"stream":"stdout","data":"line\r\nlast\u2028"}`},
		{ID: "c5", Event: "exit"},
	}
	for i, ev := range all {
		if ev.ID == after {
			all = all[i+1:]
			break
		}
	}
	if len(got) != len(all) {
		t.Fatalf("got %d events %+v, want %d", len(got), got, len(all))
	}
	for i, w := range all {
		g := got[i]
		if g.ID != w.ID || g.Event != w.Event || (w.Data != "" && g.Data != w.Data) {
			t.Errorf("event %d: got %+v, want %+v", i, g, w)
		}
	}
	exit := decodeObject(t, []byte(got[len(got)-1].Data))
	for k, v := range map[string]any{"exec_id": "exec_3", "sandbox_id": apitest.SandboxRunning, "state": "ENDED", "exit_code": 2.0,
		"duration_ms": 54.0, "output_bytes": 20.0, "ended_at": "2025-01-02T03:04:05.054Z"} {
		if exit[k] != v {
			t.Errorf("exit event: got %s = %v, want %v", k, exit[k], v)
		}
	}
	wantKeys(t, exit, nil, []string{"stdout", "stderr"})
}

func wantSSEHeaders(t *testing.T, resp *http.Response) {
	t.Helper()
	for k, v := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"} {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("got %s %q, want %q", k, got, v)
		}
	}
}

func TestExecStream(t *testing.T) {
	f, _ := streamFixture()
	srv := httptest.NewServer(newTestHandler(t, f))
	defer srv.Close()
	req := newRequest(t, context.Background(), http.MethodPost, srv.URL+execURL, strings.NewReader(`{"command":["make"]}`),
		"Accept", "application/json;q=0.5, Text/Event-Stream")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("got status %d, want 200", resp.StatusCode)
	}
	wantSSEHeaders(t, resp)
	events := readEvents(t, resp.Body, nil) // to EOF: the stream ends after the exit event
	if len(events) == 0 || events[0].Event != "started" || events[0].ID != "" {
		t.Fatalf("got events %+v, want a started event without id first", events)
	}
	started := decodeObject(t, []byte(events[0].Data))
	for k, v := range map[string]any{"exec_id": "exec_3", "sandbox_id": apitest.SandboxRunning, "state": "RUNNING", "command": "make",
		"output_url": Prefix + "/" + apitest.SandboxRunning + "/execs/exec_3/output"} {
		if started[k] != v {
			t.Errorf("started event: got %s = %v, want %v", k, started[k], v)
		}
	}
	wantKeys(t, started, nil, []string{"exit_code", "ended_at"})
	wantStream(t, events[1:], "")
	reqs, afters := execCalls(f)
	if len(reqs) != 1 || !reqs[0].Detach {
		t.Errorf("got exec requests %+v, want one detached", reqs)
	}
	if !slices.Equal(afters, []string{""}) {
		t.Errorf("got output subscriptions after %q, want one from the start", afters)
	}
	waitOutputs(t, f, 5*time.Second)
}

func TestExecStreamErrors(t *testing.T) {
	t.Run("exec-fails-before-the-stream", func(t *testing.T) {
		f, _ := streamFixture()
		f.ExecErr = apierror.New(apierror.InvalidState, "sandbox "+apitest.SandboxRunning+" is STOPPED")
		rec := serve(t, newTestHandler(t, f), http.MethodPost, execURL, `{"command":["make"]}`, "Accept", "text/event-stream")
		wantError(t, rec, http.StatusConflict, "INVALID_STATE", "STOPPED")
	})
	t.Run("output-fails-after-started", func(t *testing.T) {
		f, _ := streamFixture()
		f.OutputErr = apierror.New(apierror.Unavailable, "exec output is unavailable")
		rec := serve(t, newTestHandler(t, f), http.MethodPost, execURL, `{"command":["make"]}`, "Accept", "text/event-stream")
		events := readEvents(t, rec.Body, nil)
		if len(events) != 2 || events[0].Event != "started" || events[1].Event != "error" {
			t.Fatalf("got %+v, want started then error", events)
		}
		if want := `{"code":"UNAVAILABLE","message":"exec output is unavailable"}`; events[1].Data != want {
			t.Errorf("got error data %s, want %s", events[1].Data, want)
		}
	})
}

func wantError(t *testing.T, rec *httptest.ResponseRecorder, status int, code string, mention ...string) {
	t.Helper()
	if rec.Code != status {
		t.Errorf("got status %d, want %d: %s", rec.Code, status, rec.Body)
	}
	if got := rec.Header().Get("Content-Type"); got != "application/json" {
		t.Errorf("got Content-Type %q, want application/json", got)
	}
	var body struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("got %q, want a JSON error: %v", rec.Body, err)
	}
	if body.Error.Code != code {
		t.Errorf("got code %q, want %q", body.Error.Code, code)
	}
	for _, m := range mention {
		if !strings.Contains(body.Error.Message, m) {
			t.Errorf("got message %q, want it to mention %q", body.Error.Message, m)
		}
	}
}

func TestExecStatus(t *testing.T) {
	f := apitest.New()
	f.Execs["exec_r"] = sandbox.ExecResult{ExecID: "exec_r", SandboxID: apitest.SandboxRunning, Command: "sleep 9", State: sandbox.ExecRunning,
		StartedAt: apitest.T0, Stdout: []byte("so far"), OutputBytes: 6}
	f.Execs["exec_e"] = sandbox.ExecResult{ExecID: "exec_e", SandboxID: apitest.SandboxRunning, Command: "true", State: sandbox.ExecEnded,
		StartedAt: apitest.T0, EndedAt: t1, Duration: 54 * time.Millisecond, Stdout: []byte{0xff}, StdoutTruncated: true, OutputBytes: 9000}
	f.Execs["exec_other"] = sandbox.ExecResult{ExecID: "exec_other", SandboxID: "sbx_2", State: sandbox.ExecRunning}
	h := newTestHandler(t, f)
	exitFields := []string{"exit_code", "timed_out", "duration_ms", "duration_sec", "ended_at"}
	output := []string{"stdout", "stderr", "stdout_truncated", "stderr_truncated", "output_bytes", "command", "status_url", "output_url"}

	t.Run("running", func(t *testing.T) {
		rec := serve(t, h, http.MethodGet, Prefix+"/"+apitest.SandboxRunning+"/execs/exec_r", "")
		if rec.Code != http.StatusOK {
			t.Fatalf("got status %d, want 200: %s", rec.Code, rec.Body)
		}
		m := decodeObject(t, rec.Body.Bytes())
		wantKeys(t, m, output, exitFields)
		if m["state"] != "RUNNING" || m["stdout"] != "so far" || m["output_bytes"] != 6.0 {
			t.Errorf("got %v, want state RUNNING, stdout so far, output_bytes 6", m)
		}
	})
	t.Run("ended", func(t *testing.T) {
		rec := serve(t, h, http.MethodGet, Prefix+"/"+apitest.SandboxRunning+"/execs/exec_e", "")
		m := decodeObject(t, rec.Body.Bytes())
		wantKeys(t, m, append(output, exitFields...), nil)
		if m["state"] != "ENDED" || m["exit_code"] != 0.0 || m["stdout_base64"] != "/w==" || m["stdout_truncated"] != true {
			t.Errorf("got %v, want state ENDED, exit_code 0, stdout_base64 /w==, stdout_truncated", m)
		}
	})
	t.Run("another-sandbox", func(t *testing.T) {
		wantError(t, serve(t, h, http.MethodGet, Prefix+"/"+apitest.SandboxRunning+"/execs/exec_other", ""), http.StatusNotFound, "NOT_FOUND")
	})
	t.Run("unknown", func(t *testing.T) {
		wantError(t, serve(t, h, http.MethodGet, Prefix+"/"+apitest.SandboxRunning+"/execs/exec_nope", ""), http.StatusNotFound, "NOT_FOUND")
	})
}

func TestExecOutputReattach(t *testing.T) {
	cases := []struct {
		name      string
		query     string
		lastID    string
		ended     bool
		wantAfter string
	}{
		{name: "from-start", wantAfter: ""},
		{name: "after", query: "?after=c2", wantAfter: "c2"},
		{name: "last-event-id", lastID: "c3", wantAfter: "c3"},
		{name: "after-wins-over-last-event-id", query: "?after=c1", lastID: "c3", wantAfter: "c1"},
		{name: "empty-after-is-the-start", query: "?after=", lastID: "c3", wantAfter: ""},
		{name: "ended-replay", query: "?after=c1", ended: true, wantAfter: "c1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, ended := streamFixture()
			if c.ended {
				f.Execs["exec_3"] = ended
			}
			srv := httptest.NewServer(newTestHandler(t, f))
			defer srv.Close()
			var headers []string
			if c.lastID != "" {
				headers = []string{"Last-Event-ID", c.lastID}
			}
			req := newRequest(t, context.Background(), http.MethodGet, srv.URL+Prefix+"/"+apitest.SandboxRunning+"/execs/exec_3/output"+c.query, nil, headers...)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("got status %d, want 200", resp.StatusCode)
			}
			wantSSEHeaders(t, resp)
			wantStream(t, readEvents(t, resp.Body, nil), c.wantAfter)
			if _, afters := execCalls(f); !slices.Equal(afters, []string{c.wantAfter}) {
				t.Errorf("got subscriptions after %q, want [%q]", afters, c.wantAfter)
			}
			waitOutputs(t, f, 5*time.Second)
		})
	}
	t.Run("ended-nothing-left", func(t *testing.T) {
		// An EventSource reconnecting after the exit event gets 204 and stops.
		f, ended := streamFixture()
		f.Execs["exec_3"] = ended
		rec := serve(t, newTestHandler(t, f), http.MethodGet, Prefix+"/"+apitest.SandboxRunning+"/execs/exec_3/output", "", "Last-Event-ID", "c5")
		if rec.Code != http.StatusNoContent || rec.Body.Len() != 0 {
			t.Errorf("got status %d and %q, want 204 and no body", rec.Code, rec.Body)
		}
		waitOutputs(t, f, 5*time.Second)
	})
}

func TestExecOutputRefused(t *testing.T) {
	cases := []struct {
		name, path string
		headers    []string
		status     int
		code       string
		subscribed bool
	}{
		{name: "exec-of-another-sandbox", path: Prefix + "/sbx_2/execs/exec_3/output", status: http.StatusNotFound, code: "NOT_FOUND"},
		{name: "unknown-exec", path: Prefix + "/" + apitest.SandboxRunning + "/execs/exec_9/output", status: http.StatusNotFound, code: "NOT_FOUND"},
		{name: "bad-after", path: Prefix + "/" + apitest.SandboxRunning + "/execs/exec_3/output?after=" + apitest.BadCursor, status: http.StatusBadRequest, code: "INVALID_ARGUMENT", subscribed: true},
		{name: "bad-last-event-id", path: Prefix + "/" + apitest.SandboxRunning + "/execs/exec_3/output", headers: []string{"Last-Event-ID", apitest.BadCursor},
			status: http.StatusBadRequest, code: "INVALID_ARGUMENT", subscribed: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, _ := streamFixture()
			wantError(t, serve(t, newTestHandler(t, f), http.MethodGet, c.path, "", c.headers...), c.status, c.code)
			if _, afters := execCalls(f); (len(afters) > 0) != c.subscribed {
				t.Errorf("got subscriptions %q, want subscribed = %v", afters, c.subscribed)
			}
		})
	}
}

func TestExecStreamClientStopsReading(t *testing.T) {
	// 64 KiB chunks until the subscription ends, as an exec with a lot of output would make.
	f, _ := streamFixture()
	f.ExecEvents["exec_3"], f.ExecEndless = nil, bytes.Repeat([]byte("x"), 64<<10)
	h := newTestHandler(t, f)
	h.writeTimeout = 100 * time.Millisecond
	srv := httptest.NewServer(h)
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(4096)
	fmt.Fprintf(conn, "GET %s/%s/execs/exec_3/output HTTP/1.1\r\nHost: x\r\nX-Api-Key: %s\r\n\r\n", Prefix, apitest.SandboxRunning, apitest.UserKey)
	// Never read: the write deadline ends the stream and its subscription.
	waitOutputs(t, f, 10*time.Second)
}

func TestExecStreamEnds(t *testing.T) {
	cases := []struct {
		name string
		end  func(cancel context.CancelFunc, shutdown chan struct{})
	}{
		{name: "client-goes", end: func(cancel context.CancelFunc, _ chan struct{}) { cancel() }},
		{name: "shutdown", end: func(_ context.CancelFunc, shutdown chan struct{}) { close(shutdown) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Nothing until the subscription ends, as an exec that prints nothing would send.
			f, _ := streamFixture()
			f.ExecEvents["exec_3"], f.ExecHold = nil, true
			h := newTestHandler(t, f)
			shutdown := make(chan struct{})
			h.shutdown = shutdown
			h.keepAlive = 10 * time.Millisecond
			srv := httptest.NewServer(h)
			defer srv.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req := newRequest(t, ctx, http.MethodGet, srv.URL+Prefix+"/"+apitest.SandboxRunning+"/execs/exec_3/output", nil)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			// An idle stream sends keepalive comments.
			got := readEvents(t, resp.Body, func(ev sseEvent) bool { return ev.Comment == "keepalive" })
			if len(got) == 0 || got[len(got)-1].Comment != "keepalive" {
				t.Fatalf("got %+v, want a keepalive comment", got)
			}
			c.end(cancel, shutdown)
			waitOutputs(t, f, 5*time.Second)
			if c.name == "shutdown" {
				// The stream ends without an exit event: the client reattaches elsewhere.
				for _, ev := range readEvents(t, resp.Body, nil) {
					if ev.Event != "" {
						t.Errorf("got event %+v after shutdown, want none", ev)
					}
				}
			}
		})
	}
}

func TestExecStreamBurst(t *testing.T) {
	// Many ready events arrive whole and in order through the burst writes.
	f, ended := streamFixture()
	var evs []sandbox.ExecEvent
	for i := range 1000 {
		evs = append(evs, sandbox.ExecEvent{Kind: sandbox.ExecChunk, Cursor: fmt.Sprint(i), Stream: "stdout", Data: []byte(fmt.Sprint(i))})
	}
	f.ExecEvents["exec_3"] = append(evs, sandbox.ExecEvent{Kind: sandbox.ExecExit, Cursor: "end", Result: &ended})
	rec := serve(t, newTestHandler(t, f), http.MethodGet, Prefix+"/"+apitest.SandboxRunning+"/execs/exec_3/output", "")
	got := readEvents(t, rec.Body, nil)
	if len(got) != 1001 || got[1000].Event != "exit" {
		t.Fatalf("got %d events, want 1001 ending with exit", len(got))
	}
	for i, ev := range got[:1000] {
		if want := fmt.Sprintf(`{"stream":"stdout","data":"%d"}`, i); ev.ID != fmt.Sprint(i) || ev.Data != want {
			t.Fatalf("event %d: got %+v, want id %d and %s", i, ev, i, want)
		}
	}
}

func TestAcceptsEventStream(t *testing.T) {
	cases := []struct {
		name   string
		accept []string
		want   bool
	}{
		{name: "none", want: false},
		{name: "any", accept: []string{"*/*"}, want: false},
		{name: "json", accept: []string{"application/json"}, want: false},
		{name: "exact", accept: []string{"text/event-stream"}, want: true},
		{name: "case", accept: []string{"Text/Event-Stream"}, want: true},
		{name: "among-others", accept: []string{"application/json, text/event-stream"}, want: true},
		{name: "with-params", accept: []string{"application/json;q=0.9,text/event-stream; charset=utf-8 ;q=0.5"}, want: true},
		{name: "second-header", accept: []string{"application/json", "text/event-stream"}, want: true},
		{name: "q-zero", accept: []string{"text/event-stream;q=0, application/json"}, want: false},
		{name: "q-zero-point-zero", accept: []string{"text/event-stream; Q=0.0"}, want: false},
		{name: "prefix-only", accept: []string{"text/event-streams"}, want: false},
		{name: "text-any", accept: []string{"text/*"}, want: false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range c.accept {
				h.Add("Accept", v)
			}
			if got := acceptsEventStream(h); got != c.want {
				t.Errorf("got %v for Accept %q, want %v", got, c.accept, c.want)
			}
		})
	}
}

func TestExecBadInputs(t *testing.T) {
	status := Prefix + "/" + apitest.SandboxRunning + "/execs/exec_3"
	cases := []struct {
		name, method, path, body string
		headers                  []string
		status                   int
		code                     string
		mention                  []string
	}{
		{name: "status-post", method: http.MethodPost, path: status, body: `{}`, status: http.StatusNotFound, code: "NOT_FOUND"},
		{name: "status-delete", method: http.MethodDelete, path: status, status: http.StatusNotFound, code: "NOT_FOUND"},
		{name: "output-post", method: http.MethodPost, path: status + "/output", body: `{}`, status: http.StatusNotFound, code: "NOT_FOUND"},
		{name: "output-put", method: http.MethodPut, path: status + "/output", body: `{}`, status: http.StatusNotFound, code: "NOT_FOUND"},
		{name: "exec-get", method: http.MethodGet, path: execURL, status: http.StatusNotFound, code: "NOT_FOUND"},
		{name: "execs-post", method: http.MethodPost, path: Prefix + "/" + apitest.SandboxRunning + "/execs", body: `{}`, status: http.StatusNotFound, code: "NOT_FOUND"},
		{name: "execs-trailing-slash", method: http.MethodGet, path: Prefix + "/" + apitest.SandboxRunning + "/execs/", status: http.StatusNotFound, code: "NOT_FOUND"},
		{name: "output-sub-path", method: http.MethodGet, path: status + "/output/more", status: http.StatusNotFound, code: "NOT_FOUND"},
		{name: "status-no-key", method: http.MethodGet, path: status, headers: []string{"X-Api-Key", ""}, status: http.StatusUnauthorized, code: "UNAUTHENTICATED"},
		{name: "output-bad-key", method: http.MethodGet, path: status + "/output", headers: []string{"X-Api-Key", "nope"}, status: http.StatusUnauthorized, code: "UNAUTHENTICATED"},
		{name: "wait-string", method: http.MethodPost, path: execURL, body: `{"command":["true"],"wait":"no"}`, status: http.StatusBadRequest, code: "INVALID_ARGUMENT", mention: []string{"wait"}},
		{name: "wait-string-false", method: http.MethodPost, path: execURL, body: `{"command":["true"],"wait":"false"}`, status: http.StatusBadRequest, code: "INVALID_ARGUMENT", mention: []string{"wait", "bool"}},
		{name: "wait-number", method: http.MethodPost, path: execURL, body: `{"command":["true"],"wait":0}`, status: http.StatusBadRequest, code: "INVALID_ARGUMENT", mention: []string{"wait"}},
		{name: "wait-object", method: http.MethodPost, path: execURL, body: `{"command":["true"],"wait":{}}`, status: http.StatusBadRequest, code: "INVALID_ARGUMENT", mention: []string{"wait"}},
		{name: "detach-unknown", method: http.MethodPost, path: execURL, body: `{"command":["true"],"detach":true}`, status: http.StatusBadRequest, code: "INVALID_ARGUMENT", mention: []string{"detach"}},
		{name: "stdin-both-no-wait", method: http.MethodPost, path: execURL, body: `{"command":["cat"],"stdin":"a","stdin_base64":"YQ==","wait":false}`, status: http.StatusBadRequest, code: "INVALID_ARGUMENT", mention: []string{"stdin_base64"}},
		{name: "bad-body-streaming", method: http.MethodPost, path: execURL, body: `{"command":["true"],"wait":1}`, headers: []string{"Accept", "text/event-stream"}, status: http.StatusBadRequest, code: "INVALID_ARGUMENT", mention: []string{"wait"}},
		{name: "empty-body-streaming", method: http.MethodPost, path: execURL, headers: []string{"Accept", "text/event-stream"}, status: http.StatusBadRequest, code: "INVALID_ARGUMENT", mention: []string{"JSON"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, _ := streamFixture()
			wantError(t, serve(t, newTestHandler(t, f), c.method, c.path, c.body, c.headers...), c.status, c.code, c.mention...)
			if reqs, afters := execCalls(f); len(reqs) != 0 || len(afters) != 0 {
				t.Errorf("got exec calls %+v and subscriptions %q, want none", reqs, afters)
			}
		})
	}
}
