package openapitest_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sandboxd/client"
	"sandboxd/internal/api/apitest"
	"sandboxd/internal/apierror"
	"sandboxd/internal/rest"
	"sandboxd/internal/rest/openapitest"
	"sandboxd/internal/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const v1 = rest.Prefix

func spec(t *testing.T) *openapitest.Spec {
	t.Helper()
	sp, err := openapitest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

// send makes one request through a checking transport and answers its status, after reading
// the whole answer (a stream's events are checked as they are read).
func send(t *testing.T, c *http.Client, method, url, body string, headers ...string) int {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("%s %s: reading: %v", method, url, err)
	}
	return resp.StatusCode
}

// TestCatchesDrift: a server that strays from the document in each way the checker knows is
// reported, once per exchange, with what is wrong; the exchanges that follow the document are
// not.
func TestCatchesDrift(t *testing.T) {
	const sandboxJSON = `{"sandbox_id":"sbx_1","tenant_id":"t","project_id":"p","profile":"d","state":"RUNNING",
		"created_at":"2026-01-01T00:00:00Z","state_changed_at":"2026-01-01T00:00:00Z","autostop_sec":1,"ttl_sec":2,
		"resources":{"milli_cpu":1,"memory_bytes":2,"disk_bytes":3},"network":"none",
		"network_policy":{"mode":"none","egress_allow":[],"egress_deny":[],"always_deny":[],"dns_servers":[],"pinned":{}},
		"labels":{}%s}`
	const execJSON = `{"exec_id":"exec_1","started_at":"2026-01-01T00:00:00Z","sandbox_id":"sbx_1","state":%q,"output_bytes":0,
		"output_url":"/o","status_url":"/s","stdin_open":false%s}`
	answers := map[string]func(w http.ResponseWriter){
		"GET " + v1 + "/sbx_ok": func(w http.ResponseWriter) { writeJSON(w, 200, fmt.Sprintf(sandboxJSON, "")) },
		"GET " + v1 + "/sbx_extra": func(w http.ResponseWriter) {
			writeJSON(w, 200, fmt.Sprintf(sandboxJSON, `,"surprise":true`))
		},
		"GET " + v1 + "/sbx_teapot":    func(w http.ResponseWriter) { writeJSON(w, 418, `{"error":{"code":"INTERNAL","message":"x"}}`) },
		"GET " + v1 + "/sbx_1/nothing": func(w http.ResponseWriter) { writeJSON(w, 200, `{}`) },
		"GET " + v1 + "/sbx_1/gone": func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(404)
		},
		"POST " + v1: func(w http.ResponseWriter) { writeJSON(w, 201, fmt.Sprintf(sandboxJSON, "")) },
		"GET " + v1 + "/quota": func(w http.ResponseWriter) {
			writeJSON(w, 200, `{"limit":1,"in_use":"one"}`)
		},
		"GET " + v1 + "/sbx_1/execs": func(w http.ResponseWriter) {
			writeJSON(w, 200, `{"execs":[`+fmt.Sprintf(execJSON, "RUNNING", `,"stdout":"leaked"`)+`]}`)
		},
		"GET " + v1 + "/sbx_1/execs/exec_2": func(w http.ResponseWriter) {
			writeJSON(w, 200, fmt.Sprintf(execJSON, "RUNNING", `,"stdout":"","stderr":"","stdout_truncated":false,"stderr_truncated":false,"exit_code":0`))
		},
		"GET " + v1 + "/sbx_1/execs/exec_3": func(w http.ResponseWriter) {
			writeJSON(w, 200, fmt.Sprintf(execJSON, "ENDED", `,"stdout":"","stderr":"","stdout_truncated":false,"stderr_truncated":false,"exit_code":0,
				"timed_out":false,"duration_ms":1,"duration_sec":0.001,"ended_at":"2026-01-01T00:00:01Z"`))
		},
		"GET " + v1 + "/sbx_1/files": func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Last-Modified", "Mon, 02 Jan 2006 15:04:05 GMT")
			w.Header().Set("Content-Length", "2")
			w.Write([]byte("hi"))
		},
		"GET " + v1 + "/sbx_1/execs/exec_1/output": func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			io.WriteString(w, "id: c1\nevent: chunk\ndata: {\"stream\":\"stdout\",\"data\":\"x\"}\n\n"+
				": keepalive\n\n"+
				"id: c2\nevent: chunk\ndata: {\"stream\":\"stdout\",\"data\":\"x\",\"extra\":1}\n\n"+
				"event: bogus\ndata: {}\n\n")
		},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a, ok := answers[r.Method+" "+r.URL.Path]; ok {
			a(w)
			return
		}
		writeJSON(w, 404, `{"error":{"code":"NOT_FOUND","message":"no"}}`)
	}))
	defer srv.Close()
	var v openapitest.Violations
	c := &http.Client{Transport: spec(t).Transport(nil, v.Report)}
	key := "X-Api-Key: k"
	for _, tc := range []struct {
		name, method, path, body string
		headers                  []string
		want                     string // "" for no violation
	}{
		{"follows", "GET", "/sbx_ok", "", []string{key}, ""},
		{"unknown-member", "GET", "/sbx_extra", "", []string{key}, "surprise"},
		{"undocumented-status", "GET", "/sbx_teapot", "", []string{key}, "status is not supported"},
		{"undocumented-route", "GET", "/sbx_1/nothing", "", []string{key}, "yet the server did not answer 404"},
		{"not-found-without-error-body", "GET", "/sbx_1/gone", "", []string{key}, "want the JSON error body"},
		{"unknown-path-not-found", "GET", "/sbx_1/else", "", []string{key}, ""},
		{"accepted-bad-body", "POST", "", `{"profile":"d","bogus":1}`, []string{key, "Content-Type: application/json"}, "accepted a request the document refuses"},
		{"accepted-without-key", "POST", "", `{"profile":"d"}`, []string{"Content-Type: application/json"}, "no X-Api-Key header"},
		{"good-create", "POST", "", `{"profile":"d"}`, []string{key, "Content-Type: application/json"}, ""},
		{"wrong-type", "GET", "/quota", "", []string{key}, "in_use"},
		{"output-in-a-list", "GET", "/sbx_1/execs", "", []string{key}, "ExecPage"},
		{"exit-before-the-end", "GET", "/sbx_1/execs/exec_2", "", []string{key}, "ExecStatusWithOutput"},
		{"ended-exec", "GET", "/sbx_1/execs/exec_3", "", []string{key}, ""},
		{"missing-header", "GET", "/sbx_1/files?path=a", "", []string{key}, "X-File-Mode"},
		{"bad-event", "GET", "/sbx_1/execs/exec_1/output", "", []string{key}, `event "chunk" does not match`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(v.List())
			send(t, c, tc.method, srv.URL+v1+tc.path, tc.body, tc.headers...)
			got := v.List()[before:]
			if tc.want == "" {
				if len(got) != 0 {
					t.Errorf("got %q, want no violation", got)
				}
				return
			}
			if len(got) == 0 || !strings.Contains(strings.Join(got, "\n"), tc.want) {
				t.Errorf("got %q, want a violation mentioning %q", got, tc.want)
			}
		})
	}
	if got := strings.Join(v.List(), "\n"); !strings.Contains(got, `an event "bogus" that the document does not list`) {
		t.Errorf("an unlisted event was not reported: %s", got)
	}
}

func writeJSON(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	io.WriteString(w, body)
}

// TestContract: the real REST handler (over the shared fake) answers every operation as the
// document says, through the public Go client and curl-shaped requests, errors included.
func TestContract(t *testing.T) {
	ws := apitest.NewWorkspace()
	ended := apitest.EndedExec()
	output := []sandbox.ExecEvent{
		{Kind: sandbox.ExecChunk, Cursor: "1-0", Stream: "stdout", Data: []byte("hello\n")},
		{Kind: sandbox.ExecChunk, Cursor: "2-0", Stream: "stderr", Data: []byte("oops\xff")},
		{Kind: sandbox.ExecTruncated, Cursor: "3-0", MissedBytes: 7},
		{Kind: sandbox.ExecExit, Cursor: "4-0", Result: &ended},
	}
	// A stream (of the detached ExecRunning) and a reattach (to ExecEnded) end with the exit.
	ws.ExecEvents[apitest.ExecEnded], ws.ExecEvents[apitest.ExecRunning] = output, output
	log := slog.New(slog.DiscardHandler)
	mux := http.NewServeMux()
	mux.Handle("GET "+rest.OpenAPIPath, rest.OpenAPIHandler(log))
	mux.Handle("/", rest.New(ws, apitest.Authenticator(t), log, nil))
	srv := httptest.NewServer(mux)
	defer func() {
		srv.Close()
		ws.WaitStreams(t, 5*time.Second)
	}()
	var v openapitest.Violations
	hc := &http.Client{Transport: spec(t).Transport(nil, v.Report)}
	c, err := client.New(client.WithBaseURL(srv.URL), client.WithAPIKey(apitest.UserKey), client.WithHTTPClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := apitest.SandboxRunning
	last := time.Now()
	must := func(what string, err error) {
		t.Helper()
		if d := time.Since(last); d > time.Second {
			t.Logf("%s took %s", what, d)
		}
		last = time.Now()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	_, err = c.Create(ctx, client.CreateRequest{Profile: "sandboxes-default", Labels: map[string]string{"team": "ml"}})
	must("create", err)
	_, err = c.List(ctx, client.ListOptions{Limit: 2})
	must("list", err)
	_, err = c.Get(ctx, id)
	must("get", err)
	_, err = c.Update(ctx, id, client.UpdateRequest{RemoveLabels: []string{"team"}, AutostopSec: client.Ptr[int64](600)})
	must("update", err)
	_, err = c.Quota(ctx)
	must("quota", err)
	_, err = c.Exec(ctx, id, client.ExecRequest{Command: []string{"make", "test"}})
	must("exec", err)
	_, err = c.ExecDetached(ctx, id, client.ExecRequest{Command: []string{"sleep", "60"}, StdinOpen: true})
	must("exec detached", err)
	_, err = c.ExecStatus(ctx, id, apitest.ExecEnded)
	must("exec status", err)
	_, err = c.ListExecs(ctx, id, client.ListExecsOptions{})
	must("list execs", err)
	_, err = c.SignalExec(ctx, id, apitest.ExecRunning, "SIGTERM")
	must("signal", err)
	_, err = c.WriteStdin(ctx, id, apitest.ExecRunning, []byte("hi\n"), false)
	must("stdin", err)
	st, err := c.ExecStream(ctx, id, client.ExecRequest{Command: []string{"make", "test"}})
	must("exec stream", err)
	drain(t, st)
	st, err = c.ExecOutput(ctx, id, apitest.ExecEnded, "")
	must("exec output", err)
	drain(t, st)
	_, err = c.WriteFile(ctx, id, "src/a.txt", strings.NewReader("hello"), 0o600)
	must("write file", err)
	_, err = c.ReadFile(ctx, id, "src/a.txt")
	must("read file", err)
	_, err = c.ListFiles(ctx, id, "src", 10)
	must("list files", err)
	_, err = c.Stat(ctx, id, "src/a.txt")
	must("stat", err)
	_, _, err = c.MakeDir(ctx, id, "out")
	must("mkdir", err)
	_, err = c.MoveFile(ctx, id, "src/a.txt", "out/b.txt", false)
	must("move", err)
	must("delete", c.DeleteFile(ctx, id, "out", true))
	// A watch's events, then the error that ends it (the watched folder went away).
	ws.FileEvents = append(apitest.FileEventFixtures(),
		sandbox.FileEvent{Cursor: "w0123456789abcdef.11", Kind: sandbox.FileWatchError, Code: apierror.NotFound, Message: "the watched folder was deleted", At: apitest.T0})
	w, err := c.WatchFiles(ctx, id, "src", client.WatchOptions{Recursive: true})
	must("watch", err)
	for range apitest.FileEventFixtures() {
		_, err := w.Next()
		must("watch event", err)
	}
	if _, err := w.Next(); err == nil {
		t.Errorf("the watch's error event: got no error")
	}
	w.Close()
	_, err = c.Snapshot(ctx, id)
	must("snapshot", err)
	_, err = c.Snapshots(ctx, id, 5)
	must("snapshots", err)
	_, err = c.Snapshots(ctx, "", 5)
	must("project snapshots", err)
	must("delete snapshot", c.DeleteSnapshot(ctx, apitest.SnapOld))
	_, err = c.Stop(ctx, id)
	must("stop", err)
	_, err = c.Start(ctx, id)
	must("start", err)
	_, err = c.StartAgentRun(ctx, client.AgentRunRequest{AgentID: "opencode", Model: "m", Instruction: "go on", SandboxID: id})
	must("start agent run", err)
	_, err = c.AgentRun(ctx, apitest.RunDone)
	must("agent run", err)
	_, err = c.AgentRuns(ctx, id)
	must("agent runs", err)
	ev, err := c.AgentRunEvents(ctx, apitest.RunDone, "")
	must("agent run events", err)
	drain(t, ev)
	_, err = c.CancelAgentRun(ctx, apitest.RunRunning)
	must("cancel agent run", err)
	_, err = c.Destroy(ctx, id)
	must("destroy", err)

	// Errors, as curl users meet them.
	k, j := "X-Api-Key: "+apitest.UserKey, "Content-Type: application/json"
	for _, tc := range []struct {
		method, path, body string
		headers            []string
		want               int
	}{
		{"GET", v1, "", nil, 401},
		{"GET", v1 + "/sbx_other", "", []string{k}, 404},
		{"GET", v1 + "/" + id + "/nothing", "", []string{k}, 404},
		{"PUT", v1 + "/" + id, "", []string{k}, 404},
		{"POST", v1, `{"profile":"x","bogus":1}`, []string{k, j}, 400},
		{"POST", v1 + "/" + id + "/exec", `{"command":["cat"],"stdin":"a","stdin_base64":"YQ=="}`, []string{k, j}, 400},
		{"POST", v1 + "/" + id + "/execs/" + apitest.ExecRunning + "/resize", `{"rows":0,"cols":80}`, []string{k, j}, 400},
		{"POST", v1 + "/" + apitest.SandboxBusy + "/stop", "", []string{k}, 409},
		{"GET", v1 + "/" + apitest.SandboxBoom, "", []string{k}, 500},
		{"GET", v1 + "?limit=0", "", []string{k}, 400},
		{"POST", v1 + "/" + id + "/execs/" + apitest.ExecEnded + "/signal", `{"signal":"SIGKILL"}`, []string{k, j}, 409},
		{"GET", v1 + "/" + id + "/execs/" + apitest.ExecEnded + "/tty", "", []string{k}, 400},
		{"GET", "/sandbox/agent/v1/runs", "", []string{k}, 400},
		{"DELETE", v1 + "/snapshots/" + apitest.SnapLatest, "", []string{k}, 409},
		{"GET", v1 + "/" + id, "", []string{k, "X-Sandbox-Tenant-Id: other", "X-Sandbox-Project-Id: p"}, 403},
	} {
		if got := send(t, hc, tc.method, srv.URL+tc.path, tc.body, tc.headers...); got != tc.want {
			t.Errorf("%s %s: got %d, want %d", tc.method, tc.path, got, tc.want)
		}
	}
	for _, msg := range v.List() {
		t.Error(msg)
	}
}

// drain reads a stream to its end.
func drain(t *testing.T, st *client.Stream) {
	t.Helper()
	defer st.Close()
	for {
		if _, err := st.Next(); err != nil {
			if err != io.EOF {
				t.Fatalf("stream: %v", err)
			}
			return
		}
	}
}
