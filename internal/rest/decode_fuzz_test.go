package rest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"

	"sandboxd/internal/api"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/quota"
	"sandboxd/internal/sandbox"
)

// FuzzRESTDecode drives the REST handler with client bytes: a JSON body (create, exec, agent
// run, the body-less verbs) or a query string (list, files, snapshots). The handler must never
// panic, and it either refuses with a coded error (the status of its code, a decoder's code)
// or calls the service with what the client sent: exactly one JSON object, stdin from exactly
// one of stdin and stdin_base64, positive limits, octal modes that fit.
func FuzzRESTDecode(f *testing.F) {
	for _, s := range []struct {
		op    uint8
		query string
		body  string
	}{
		{fzCreate, "", `{}`},
		{fzCreate, "", `{"profile":"small","autostop_sec":60,"ttl_sec":3600,"env":{"A":"1"},"source":{"snapshot_id":"snap_1"}}`},
		{fzCreate, "", `{"PROFILE":"x","Profile":"y"}`},
		{fzCreate, "", `null`},
		{fzCreate, "", `{} }`},
		{fzCreate, "", `{}]`},
		{fzCreate, "", `{}{}`},
		{fzCreate, "", `{"nope":1}`},
		{fzCreate, "", `{"ttl_sec":1e99}`},
		{fzCreate, "", ""},
		{fzExec, "", `{"command":["bash","-lc","ls"],"timeout_sec":5,"cwd":"/workspace","wait":false}`},
		{fzExec, "", `{"command":["cat"],"stdin":"hi"}`},
		{fzExec, "", `{"command":["cat"],"stdin_base64":"aGk="}`},
		{fzExec, "", `{"command":["cat"],"stdin":"a","stdin_base64":"aGk="}`},
		{fzExec, "", `{"command":["cat"],"stdin_base64":"!!"}`},
		{fzExec, "", `{"command":["cat"],"stdin":"a","stdin":null}`},
		{fzExec, "", `{"command":["cat"],"STDIN":"a","stdin_Base64":"aGk="}`},
		{fzExec, "", `{"command":"ls"}`},
		{fzExec, "", `{"command":["bash","-i"],"stdin_open":true,"tty":{"rows":24,"cols":80}}`},
		{fzExec, "", `{"command":["bash"],"tty":{"rows":24,"cols":80,"x":1}}`},
		{fzAgent, "", `{"agent_id":"opencode","instruction":"do it","sandbox_id":"sbx_1","pass_at_k":1,"config":{"a":1}}`},
		{fzAgent, "", `{"agent_id":"opencode","pass_at_k":0}`},
		{fzAgent, "", `{"agent_id":"opencode","config":null}`},
		{fzStop, "", ""},
		{fzStop, "", " {} "},
		{fzStop, "", `{"a":1}`},
		{fzSnapshot, "", strings.Repeat(" ", 4096) + "x"},
		{fzCancel, "", "{}"},
		{fzList, "limit=10&state=running&cursor=sbx_1", ""},
		{fzList, "limit=0", ""},
		{fzList, "limit=-1", ""},
		{fzList, "limit=99999999999999999999", ""},
		{fzList, "limit=%zz", ""},
		{fzListFiles, "path=a/b&limit=5", ""},
		{fzListFiles, "path=&limit=+5", ""},
		{fzUpload, "path=a.txt&mode=0755", "data"},
		{fzUpload, "path=a.txt&mode=8", "data"},
		{fzUpload, "path=a.txt&mode=37777777777", ""},
		{fzUpload, "path=a.txt&mode=40000000000", ""},
		{fzListSnapshots, "limit=3", ""},
		{fzDownload, "path=../../etc/passwd", ""},
		{fzCreate, "", `{"labels":{"team":"ml","example.com/tier":"gold"}}`},
		{fzList, "label=team=ml&label=tier=", ""},
		{fzList, "label=team", ""},
		{fzUpdate, "", `{"labels":{"team":"ml","old":null},"autostop_sec":60,"ttl_sec":7200}`},
		{fzUpdate, "", `{"labels":null}`},
		{fzUpdate, "", `{"labels":{"a":1}}`},
		{fzUpdate, "", `{"labels":["a"]}`},
		{fzUpdate, "", `{"Labels":{"a":"1"},"labels":null}`},
		{fzUpdate, "", `{"state":"RUNNING"}`},
		{fzListExecs, "state=RUNNING&limit=2&cursor=exec_1", ""},
		{fzListExecs, "limit=x", ""},
		{fzSignal, "", `{"signal":"SIGTERM"}`},
		{fzSignal, "", `{"signal":9}`},
		{fzStdin, "close=true", "echo hi\n"},
		{fzStdin, "close=maybe", ""},
		{fzResize, "", `{"rows":24,"cols":80}`},
		{fzResize, "", `{"rows":"24"}`},
	} {
		f.Add(s.op, s.query, []byte(s.body))
	}
	svc := &fzService{}
	authn, err := auth.New([]auth.Key{{Name: "fuzz", SHA256: auth.HashKey(fzKey), Tenant: "t", Project: "p"}})
	if err != nil {
		f.Fatal(err)
	}
	h := New(svc, authn, slog.New(slog.DiscardHandler), nil)
	f.Fuzz(func(t *testing.T, op uint8, query string, body []byte) {
		if len(body) > 16<<10 || len(query) > 4<<10 {
			return
		}
		ep := fzEndpoints[int(op)%len(fzEndpoints)]
		svc.calls = svc.calls[:0]
		req := httptest.NewRequestWithContext(context.Background(), ep.method, "http://sandboxd"+ep.path, bytes.NewReader(body))
		req.URL.RawQuery = query
		req.Header.Set(auth.HeaderAPIKey, fzKey)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)

		if len(svc.calls) == 0 {
			fzCheckRefusal(t, rec, ep.name, query, body)
			return
		}
		if len(svc.calls) != 1 || svc.calls[0].verb != ep.verb {
			t.Fatalf("%s: got service calls %v, want one %s", ep.name, svc.calls, ep.verb)
		}
		if rec.Code >= 400 {
			t.Fatalf("%s: got status %d after a successful service call, want < 400: %s", ep.name, rec.Code, rec.Body)
		}
		ep.check(t, svc.calls[0], req.URL.Query(), body)
	})
}

const fzKey = "fuzz-key"

// The operations FuzzRESTDecode drives (its op byte, modulo their number).
const (
	fzCreate uint8 = iota
	fzExec
	fzAgent
	fzStop
	fzSnapshot
	fzCancel
	fzList
	fzListFiles
	fzUpload
	fzListSnapshots
	fzDownload
	fzStart
	fzUpdate
	fzListExecs
	fzSignal
	fzStdin
	fzResize
)

type fzEndpoint struct {
	name, method, path, verb string
	// check checks the one service call the request made against what the client sent.
	check func(t *testing.T, c fzCall, q map[string][]string, body []byte)
}

var fzEndpoints = []fzEndpoint{
	fzCreate:        {"create", "POST", Prefix, "Create", fzCheckCreate},
	fzExec:          {"exec", "POST", Prefix + "/sbx_1/exec", "Exec", fzCheckExec},
	fzAgent:         {"agent-run", "POST", AgentPrefix + "/runs", "StartAgentRun", fzCheckAgent},
	fzStop:          {"stop", "POST", Prefix + "/sbx_1/stop", "Stop", fzCheckEmpty},
	fzSnapshot:      {"snapshot", "POST", Prefix + "/sbx_1/snapshots", "Snapshot", fzCheckEmpty},
	fzCancel:        {"cancel", "POST", AgentPrefix + "/runs/run_1/cancel", "CancelAgentRun", fzCheckEmpty},
	fzList:          {"list", "GET", Prefix, "List", fzCheckList},
	fzListFiles:     {"list-files", "GET", Prefix + "/sbx_1/files/list", "ListDir", fzCheckListFiles},
	fzUpload:        {"upload", "PUT", Prefix + "/sbx_1/files", "WriteFile", fzCheckUpload},
	fzListSnapshots: {"list-snapshots", "GET", Prefix + "/sbx_1/snapshots", "ListSnapshots", fzCheckListSnapshots},
	fzDownload:      {"download", "GET", Prefix + "/sbx_1/files", "OpenFile", fzCheckDownload},
	fzStart:         {"start", "POST", Prefix + "/sbx_1/start", "Start", fzCheckEmpty},
	fzUpdate:        {"update", "PATCH", Prefix + "/sbx_1", "Update", fzCheckUpdate},
	fzListExecs:     {"list-execs", "GET", Prefix + "/sbx_1/execs", "ListExecs", fzCheckListExecs},
	fzSignal:        {"signal", "POST", Prefix + "/sbx_1/execs/exec_1/signal", "SignalExec", fzCheckSignal},
	fzStdin:         {"stdin", "POST", Prefix + "/sbx_1/execs/exec_1/stdin", "WriteStdin", fzCheckStdin},
	fzResize:        {"resize", "POST", Prefix + "/sbx_1/execs/exec_1/resize", "ResizeTty", fzCheckResize},
}

// fzCheckRefusal: a request that did not reach the service was refused with a coded error
// that a decoder gives (INVALID_ARGUMENT, PAYLOAD_TOO_LARGE) and its code's status.
func fzCheckRefusal(t *testing.T, rec *httptest.ResponseRecorder, name, query string, body []byte) {
	t.Helper()
	var out struct {
		Error struct {
			Code    apierror.Code `json:"code"`
			Message string        `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("%s %q %q: refused with a body that is not an error object (%v): %s", name, query, body, err, rec.Body)
	}
	c := out.Error.Code
	if c != apierror.InvalidArgument && c != apierror.PayloadTooLarge {
		t.Fatalf("%s %q %q: got code %q, want INVALID_ARGUMENT or PAYLOAD_TOO_LARGE: %s", name, query, body, c, rec.Body)
	}
	if rec.Code != c.HTTPStatus() {
		t.Fatalf("%s: got status %d for %s, want %d", name, rec.Code, c, c.HTTPStatus())
	}
	if out.Error.Message == "" {
		t.Fatalf("%s: got an empty message for %s", name, c)
	}
}

// fzObject is a JSON object's members in document order.
type fzObject []struct {
	key string
	val json.RawMessage
}

// fzMembers reads body as one JSON object with an independent reader (a token scan): ok is
// false when it is anything else.
func fzMembers(body []byte) (fzObject, bool) {
	if !json.Valid(body) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var o fzObject
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		k, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		o = append(o, struct {
			key string
			val json.RawMessage
		}{k, v})
	}
	return o, true
}

// get returns the value of a member as encoding/json assigns it to the field name: the last
// member whose key matches it case-insensitively; nil when there is none or it is null.
func (o fzObject) get(name string) json.RawMessage {
	var v json.RawMessage
	for _, m := range o {
		if strings.EqualFold(m.key, name) {
			v = m.val
		}
	}
	if string(v) == "null" {
		return nil
	}
	return v
}

// fzBodyObject: an accepted JSON body is exactly one JSON object.
func fzBodyObject(t *testing.T, body []byte) fzObject {
	t.Helper()
	o, ok := fzMembers(body)
	if !ok {
		t.Fatalf("accepted the body %q, which is not exactly one JSON object", body)
	}
	return o
}

func fzWant[T any](t *testing.T, field string, raw json.RawMessage, got T) {
	t.Helper()
	var want T
	if raw != nil {
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatalf("accepted %s %s, which is not a %T: %v", field, raw, want, err)
		}
	}
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if !bytes.Equal(g, w) {
		t.Fatalf("%s: the service got %s, want %s (sent %s)", field, g, w, raw)
	}
}

func fzCheckCreate(t *testing.T, c fzCall, _ map[string][]string, body []byte) {
	o := fzBodyObject(t, body)
	req := c.arg.(sandbox.CreateRequest)
	fzWant(t, "profile", o.get("profile"), req.Profile)
	fzWant(t, "autostop_sec", o.get("autostop_sec"), req.AutostopSec)
	fzWant(t, "ttl_sec", o.get("ttl_sec"), req.TTLSec)
	fzWant(t, "labels", o.get("labels"), req.Labels)
	if (o.get("source") == nil) != (req.Source == nil) {
		t.Fatalf("source: sent %s, the service got %+v", o.get("source"), req.Source)
	}
}

func fzCheckExec(t *testing.T, c fzCall, _ map[string][]string, body []byte) {
	o := fzBodyObject(t, body)
	req := c.arg.(sandbox.ExecRequest)
	fzWant(t, "command", o.get("command"), req.Command)
	fzWant(t, "cwd", o.get("cwd"), req.Cwd)
	fzWant(t, "timeout_sec", o.get("timeout_sec"), req.TimeoutSec)
	fzWant(t, "stdin_open", o.get("stdin_open"), req.StdinOpen)
	var tty *struct {
		Rows int `json:"rows"`
		Cols int `json:"cols"`
	}
	if req.Tty != nil {
		tty = &struct {
			Rows int `json:"rows"`
			Cols int `json:"cols"`
		}{req.Tty.Rows, req.Tty.Cols}
	}
	fzWant(t, "tty", o.get("tty"), tty)
	var wait *bool
	if raw := o.get("wait"); raw != nil {
		if err := json.Unmarshal(raw, &wait); err != nil {
			t.Fatalf("accepted wait %s: %v", raw, err)
		}
	}
	if want := wait != nil && !*wait; req.Detach != want {
		t.Fatalf("wait %s: got detach %v, want %v", o.get("wait"), req.Detach, want)
	}
	text, b64 := o.get("stdin"), o.get("stdin_base64")
	var want []byte
	switch {
	case text != nil && b64 != nil:
		t.Fatalf("accepted both stdin %s and stdin_base64 %s", text, b64)
	case text != nil:
		var s string
		if err := json.Unmarshal(text, &s); err != nil {
			t.Fatalf("accepted stdin %s: %v", text, err)
		}
		want = []byte(s)
	case b64 != nil:
		var s string
		if err := json.Unmarshal(b64, &s); err != nil {
			t.Fatalf("accepted stdin_base64 %s: %v", b64, err)
		}
		d, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			t.Fatalf("accepted stdin_base64 %q, which is not base64: %v", s, err)
		}
		want = d
	}
	if !bytes.Equal(req.Stdin, want) {
		t.Fatalf("the service got stdin %q, want %q", req.Stdin, want)
	}
	if len(req.Stdin) > maxJSONBody {
		t.Fatalf("stdin is %d bytes, more than a body may be (%d)", len(req.Stdin), maxJSONBody)
	}
}

func fzCheckAgent(t *testing.T, c fzCall, _ map[string][]string, body []byte) {
	o := fzBodyObject(t, body)
	req := c.arg.(sandbox.AgentRunRequest)
	fzWant(t, "agent_id", o.get("agent_id"), req.AgentID)
	fzWant(t, "model", o.get("model"), req.Model)
	fzWant(t, "instruction", o.get("instruction"), req.Instruction)
	fzWant(t, "sandbox_id", o.get("sandbox_id"), req.SandboxID)
	if req.PassAtK < 0 || (req.PassAtK == 0) != (o.get("pass_at_k") == nil) {
		t.Fatalf("pass_at_k %s: the service got %d, want at least 1 (0 when not sent)", o.get("pass_at_k"), req.PassAtK)
	}
	if req.Config != nil && !json.Valid(req.Config) {
		t.Fatalf("the service got config %q, which is not JSON", req.Config)
	}
	// The config sent, as sent; none when it is absent or null.
	if want := o.get("config"); !bytes.Equal(bytes.TrimSpace(req.Config), bytes.TrimSpace(want)) {
		t.Fatalf("config: the service got %q, want %q", req.Config, want)
	}
}

// fzCheckEmpty: the verbs without a body accept nothing, or exactly an empty JSON object.
func fzCheckEmpty(t *testing.T, _ fzCall, _ map[string][]string, body []byte) {
	if b := bytes.TrimSpace(body); len(b) != 0 && string(b) != "{}" {
		t.Fatalf("accepted the body %q for a call that takes none", body)
	}
}

// fzLimit checks a limit the service got: the query's positive integer, 0 when not sent.
func fzLimit(t *testing.T, q map[string][]string, got int) {
	t.Helper()
	v := ""
	if vs := q["limit"]; len(vs) > 0 {
		v = vs[0]
	}
	if v == "" {
		if got != 0 {
			t.Fatalf("limit not sent: the service got %d, want 0", got)
		}
		return
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 || n != got {
		t.Fatalf("limit %q: the service got %d, want a positive integer that is the one sent", v, got)
	}
}

func fzFirst(q map[string][]string, k string) string {
	if vs := q[k]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

func fzCheckList(t *testing.T, c fzCall, q map[string][]string, _ []byte) {
	opts := c.arg.(sandbox.ListOptions)
	fzLimit(t, q, opts.Limit)
	if want := sandbox.State(strings.ToUpper(fzFirst(q, "state"))); opts.State != want || opts.After != fzFirst(q, "cursor") {
		t.Fatalf("got %+v for the query %v", opts, q)
	}
	// Every label=key=value term, and nothing else, is in the filter.
	want := map[string]string{}
	for _, term := range q["label"] {
		k, v, ok := strings.Cut(term, "=")
		if !ok {
			t.Fatalf("accepted the label filter %q, which is not key=value", term)
		}
		if w, dup := want[k]; dup && w != v {
			t.Fatalf("accepted label %q filtered on with two values", k)
		}
		want[k] = v
	}
	if len(want) == 0 {
		want = nil
	}
	fzWant(t, "labels", mustJSON(t, want), opts.Labels)
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fzCheckUpdate: the merge patch as sent: autostop_sec and ttl_sec, the labels object with its
// nulls, and "labels": null as ClearLabels.
func fzCheckUpdate(t *testing.T, c fzCall, _ map[string][]string, body []byte) {
	o := fzBodyObject(t, body)
	req := c.arg.(sandbox.UpdateRequest)
	fzWant(t, "autostop_sec", o.get("autostop_sec"), req.AutostopSec)
	fzWant(t, "ttl_sec", o.get("ttl_sec"), req.TTLSec)
	var raw json.RawMessage
	for _, m := range o {
		if strings.EqualFold(m.key, "labels") {
			raw = m.val
		}
	}
	switch {
	case raw == nil:
		if req.Labels != nil || req.ClearLabels {
			t.Fatalf("labels not sent: the service got %v (clear %v)", req.Labels, req.ClearLabels)
		}
	case string(raw) == "null":
		if !req.ClearLabels || len(req.Labels) != 0 {
			t.Fatalf("labels null: the service got %v (clear %v), want every label cleared", req.Labels, req.ClearLabels)
		}
	default:
		if req.ClearLabels || req.Labels == nil {
			t.Fatalf("labels %s: the service got %v (clear %v)", raw, req.Labels, req.ClearLabels)
		}
		fzWant(t, "labels", raw, req.Labels)
	}
}

func fzCheckListFiles(t *testing.T, c fzCall, q map[string][]string, _ []byte) {
	a := c.arg.(fzPathLimit)
	fzLimit(t, q, a.limit)
	want := fzFirst(q, "path")
	if want == "" {
		want = "."
	}
	if a.path != want {
		t.Fatalf("path %q: the service got %q", fzFirst(q, "path"), a.path)
	}
}

func fzCheckListSnapshots(t *testing.T, c fzCall, q map[string][]string, _ []byte) {
	fzLimit(t, q, c.arg.(fzPathLimit).limit)
}

func fzCheckUpload(t *testing.T, c fzCall, q map[string][]string, body []byte) {
	a := c.arg.(fzUploadArgs)
	if v := fzFirst(q, "mode"); v != "" {
		m, err := strconv.ParseUint(v, 8, 32)
		if err != nil || os.FileMode(m) != a.mode {
			t.Fatalf("mode %q: the service got %o, want the octal number sent (32 bits at most)", v, a.mode)
		}
	} else if a.mode != 0 {
		t.Fatalf("mode not sent: the service got %o, want 0", a.mode)
	}
	if a.path != fzFirst(q, "path") || !bytes.Equal(a.data, body) {
		t.Fatalf("the service got path %q and %d bytes, want %q and the %d bytes sent", a.path, len(a.data), fzFirst(q, "path"), len(body))
	}
}

func fzCheckDownload(t *testing.T, c fzCall, q map[string][]string, _ []byte) {
	if got := c.arg.(string); got != fzFirst(q, "path") {
		t.Fatalf("the service got path %q, want %q", got, fzFirst(q, "path"))
	}
}

func fzCheckListExecs(t *testing.T, c fzCall, q map[string][]string, _ []byte) {
	opts := c.arg.(sandbox.ExecListOptions)
	fzLimit(t, q, opts.Limit)
	if string(opts.State) != fzFirst(q, "state") || opts.After != fzFirst(q, "cursor") {
		t.Fatalf("got %+v for the query %v", opts, q)
	}
}

func fzCheckSignal(t *testing.T, c fzCall, _ map[string][]string, body []byte) {
	o := fzBodyObject(t, body)
	fzWant(t, "signal", o.get("signal"), c.arg.(string))
}

func fzCheckStdin(t *testing.T, c fzCall, q map[string][]string, body []byte) {
	a := c.arg.(fzStdinArgs)
	closeAfter, err := strconv.ParseBool(fzFirst(q, "close"))
	if fzFirst(q, "close") == "" {
		closeAfter, err = false, nil
	}
	if err != nil || a.close != closeAfter || !bytes.Equal(a.data, body) {
		t.Fatalf("close %q and %d bytes: the service got close %v and %d bytes", fzFirst(q, "close"), len(body), a.close, len(a.data))
	}
}

func fzCheckResize(t *testing.T, c fzCall, _ map[string][]string, body []byte) {
	o := fzBodyObject(t, body)
	size := c.arg.(sandbox.TtySize)
	fzWant(t, "rows", o.get("rows"), size.Rows)
	fzWant(t, "cols", o.get("cols"), size.Cols)
}

type fzStdinArgs struct {
	data  []byte
	close bool
}

// fzCall is one call the service got: its verb and its arguments.
type fzCall struct {
	verb string
	arg  any
}

type fzPathLimit struct {
	path  string
	limit int
}

type fzUploadArgs struct {
	path string
	mode os.FileMode
	data []byte
}

// fzService records calls and answers them without error. The fuzz function's calls run one
// at a time, so it needs no lock.
type fzService struct {
	calls []fzCall
}

var _ api.Service = (*fzService)(nil)

func (s *fzService) record(verb string, arg any) { s.calls = append(s.calls, fzCall{verb, arg}) }

func (s *fzService) Create(_ context.Context, _ auth.Principal, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	s.record("Create", req)
	return sandbox.Sandbox{ID: "sbx_1"}, nil
}

func (s *fzService) List(_ context.Context, _ auth.Principal, opts sandbox.ListOptions) (sandbox.Page, error) {
	s.record("List", opts)
	return sandbox.Page{}, nil
}

func (s *fzService) Get(_ context.Context, _ auth.Principal, id string) (sandbox.Sandbox, error) {
	s.record("Get", id)
	return sandbox.Sandbox{ID: id}, nil
}

func (s *fzService) EventsCursor(context.Context, auth.Principal) (string, error) { return "0-0", nil }

func (s *fzService) Quota(context.Context, auth.Principal) (quota.Usage, error) {
	s.record("Quota", nil)
	return quota.Usage{}, nil
}

func (s *fzService) Stop(_ context.Context, _ auth.Principal, id string) (sandbox.Sandbox, error) {
	s.record("Stop", id)
	return sandbox.Sandbox{ID: id}, nil
}

func (s *fzService) Start(_ context.Context, _ auth.Principal, id string) (sandbox.Sandbox, error) {
	s.record("Start", id)
	return sandbox.Sandbox{ID: id}, nil
}

func (s *fzService) Pause(_ context.Context, _ auth.Principal, id string) (sandbox.Sandbox, error) {
	s.record("Pause", id)
	return sandbox.Sandbox{ID: id}, nil
}

func (s *fzService) Resume(_ context.Context, _ auth.Principal, id string) (sandbox.Sandbox, error) {
	s.record("Resume", id)
	return sandbox.Sandbox{ID: id}, nil
}

func (s *fzService) Destroy(_ context.Context, _ auth.Principal, id string) (sandbox.DestroyResult, error) {
	s.record("Destroy", id)
	return sandbox.DestroyResult{}, nil
}

func (s *fzService) Update(_ context.Context, _ auth.Principal, id string, req sandbox.UpdateRequest) (sandbox.Sandbox, error) {
	s.record("Update", req)
	return sandbox.Sandbox{ID: id}, nil
}

func (s *fzService) Exec(_ context.Context, _ auth.Principal, _ string, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	s.record("Exec", req)
	return sandbox.ExecResult{ExecID: "exec_1"}, nil
}

func (s *fzService) GetExec(_ context.Context, _ auth.Principal, _, execID string, _ bool) (sandbox.ExecResult, error) {
	s.record("GetExec", execID)
	return sandbox.ExecResult{ExecID: execID}, nil
}

func (s *fzService) ExecOutput(_ context.Context, _ auth.Principal, execID, _ string) (<-chan sandbox.ExecEvent, error) {
	s.record("ExecOutput", execID)
	ch := make(chan sandbox.ExecEvent)
	close(ch)
	return ch, nil
}

func (s *fzService) ExecOutputStatus(ctx context.Context, p auth.Principal, sandboxID, execID, after string) (sandbox.ExecResult, <-chan sandbox.ExecEvent, error) {
	st, _ := s.GetExec(ctx, p, sandboxID, execID, false)
	ch, err := s.ExecOutput(ctx, p, execID, after)
	return st, ch, err
}

func (s *fzService) OpenFile(_ context.Context, _ auth.Principal, _, path string) (io.ReadCloser, sandbox.FileInfo, error) {
	s.record("OpenFile", path)
	return io.NopCloser(strings.NewReader("")), sandbox.FileInfo{}, nil
}

func (s *fzService) WriteFile(_ context.Context, _ auth.Principal, _, path string, mode os.FileMode, r io.Reader) (sandbox.FileInfo, error) {
	data, _ := io.ReadAll(r)
	s.record("WriteFile", fzUploadArgs{path, mode, data})
	return sandbox.FileInfo{Path: path}, nil
}

func (s *fzService) ListDir(_ context.Context, _ auth.Principal, _, path string, limit int) ([]sandbox.FileInfo, bool, error) {
	s.record("ListDir", fzPathLimit{path, limit})
	return nil, false, nil
}

func (s *fzService) FilePage(context.Context, auth.Principal, string, string, sandbox.FileListOptions) (sandbox.FilePage, error) {
	s.record("FilePage", nil)
	return sandbox.FilePage{}, nil
}

func (s *fzService) Snapshot(_ context.Context, _ auth.Principal, id string) (sandbox.SnapshotInfo, error) {
	s.record("Snapshot", id)
	return sandbox.SnapshotInfo{SandboxID: id}, nil
}

func (s *fzService) ListSnapshots(_ context.Context, _ auth.Principal, sandboxID string, limit int) ([]sandbox.SnapshotInfo, error) {
	s.record("ListSnapshots", fzPathLimit{sandboxID, limit})
	return nil, nil
}

func (s *fzService) DeleteSnapshot(_ context.Context, _ auth.Principal, snapshotID string) error {
	s.record("DeleteSnapshot", snapshotID)
	return nil
}

func (s *fzService) GetSnapshot(_ context.Context, _ auth.Principal, id string) (sandbox.SnapshotInfo, error) {
	return sandbox.SnapshotInfo{ID: id}, nil
}

func (s *fzService) StartAgentRun(_ context.Context, _ auth.Principal, req sandbox.AgentRunRequest) (sandbox.AgentRun, error) {
	s.record("StartAgentRun", req)
	return sandbox.AgentRun{ID: "run_1"}, nil
}

func (s *fzService) GetAgentRun(_ context.Context, _ auth.Principal, runID string) (sandbox.AgentRun, error) {
	s.record("GetAgentRun", runID)
	return sandbox.AgentRun{ID: runID}, nil
}

func (s *fzService) ListAgentRuns(_ context.Context, _ auth.Principal, sandboxID string) ([]sandbox.AgentRun, error) {
	s.record("ListAgentRuns", sandboxID)
	return nil, nil
}

func (s *fzService) AgentRunPage(_ context.Context, _ auth.Principal, sandboxID string, _ sandbox.AgentRunListOptions) (sandbox.AgentRunPage, error) {
	s.record("AgentRunPage", sandboxID)
	return sandbox.AgentRunPage{}, nil
}

func (s *fzService) SnapshotPage(_ context.Context, _ auth.Principal, sandboxID string, _ sandbox.SnapshotListOptions) (sandbox.SnapshotPage, error) {
	s.record("SnapshotPage", sandboxID)
	return sandbox.SnapshotPage{}, nil
}

func (s *fzService) CancelAgentRun(_ context.Context, _ auth.Principal, runID string) (sandbox.AgentRun, error) {
	s.record("CancelAgentRun", runID)
	return sandbox.AgentRun{ID: runID}, nil
}

func (s *fzService) AgentRunEvents(_ context.Context, _ auth.Principal, runID, _ string) (<-chan sandbox.AgentRunEvent, error) {
	s.record("AgentRunEvents", runID)
	ch := make(chan sandbox.AgentRunEvent)
	close(ch)
	return ch, nil
}

func (s *fzService) Limits() sandbox.Limits { return sandbox.DefaultLimits() }

// REST never calls the methods below (GraphQL does); they answer like the others.

func (s *fzService) ReadFile(_ context.Context, _ auth.Principal, _, path string, maxBytes int64) ([]byte, sandbox.FileInfo, error) {
	s.record("ReadFile", path)
	return nil, sandbox.FileInfo{Path: path}, nil
}

func (s *fzService) Profiles() []sandbox.Profile {
	s.record("Profiles", nil)
	return nil
}

func (s *fzService) EventsFunc(_ context.Context, _ auth.Principal, _, _ string, _ func(sandbox.Event) bool, ended func()) error {
	s.record("Events", nil)
	go ended()
	return nil
}

func (s *fzService) ListExecs(_ context.Context, _ auth.Principal, _ string, opts sandbox.ExecListOptions) (sandbox.ExecPage, error) {
	s.record("ListExecs", opts)
	return sandbox.ExecPage{}, nil
}

func (s *fzService) SignalExec(_ context.Context, _ auth.Principal, _, execID, signal string) (sandbox.ExecResult, error) {
	s.record("SignalExec", signal)
	return sandbox.ExecResult{ExecID: execID}, nil
}

func (s *fzService) WriteStdin(_ context.Context, _ auth.Principal, _, _ string, data []byte, closeAfter bool) (sandbox.StdinResult, error) {
	s.record("WriteStdin", fzStdinArgs{append([]byte(nil), data...), closeAfter})
	return sandbox.StdinResult{Written: int64(len(data))}, nil
}

func (s *fzService) ResizeTty(_ context.Context, _ auth.Principal, _, execID string, size sandbox.TtySize) (sandbox.ExecResult, error) {
	s.record("ResizeTty", size)
	return sandbox.ExecResult{ExecID: execID}, nil
}
