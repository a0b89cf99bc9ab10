package resolvers

import (
	"bytes"
	"encoding/base64"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"go.uber.org/goleak"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const sandboxFields = `id tenantId projectId profileName state stateReason createdAt stateChangedAt autostopSec ttlSec
	expiresAt latestSnapshotId resources { milliCpu memoryBytes diskBytes } network`

func TestAuthentication(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	tests := []struct {
		name       string
		key        string
		headers    []string
		wantStatus int
		wantCode   string
	}{
		{name: "no-key", wantStatus: 401, wantCode: "UNAUTHENTICATED"},
		{name: "unknown-key", key: "nope", wantStatus: 401, wantCode: "UNAUTHENTICATED"},
		{name: "scope-from-user-key", key: apitest.UserKey, headers: []string{auth.HeaderTenant, "x", auth.HeaderProject, "y"},
			wantStatus: 403, wantCode: "PERMISSION_DENIED"},
		{name: "half-scope", key: apitest.PlatformKey, headers: []string{auth.HeaderTenant, "x"}, wantStatus: 400, wantCode: "INVALID_ARGUMENT"},
		{name: "user-key", key: apitest.UserKey, wantStatus: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.post(t, tt.key, `{ profiles { name } }`, nil, tt.headers...)
			if r.Status != tt.wantStatus {
				t.Errorf("got status %d, want %d", r.Status, tt.wantStatus)
			}
			if got := r.code(0); got != tt.wantCode {
				t.Errorf("got code %q, want %q (%+v)", got, tt.wantCode, r.Errors)
			}
		})
	}
	if got := e.fake.Called(); len(got) != 1 {
		t.Errorf("got service calls %v, want one (only the authenticated request)", got)
	}
}

func TestPlatformScope(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	r := e.post(t, apitest.PlatformKey, `{ sandbox(id: "`+apitest.SandboxRunning+`") { tenantId projectId } }`, nil,
		auth.HeaderTenant, "other", auth.HeaderProject, "proj")
	noErrors(t, r)
	var sb struct{ TenantID, ProjectID string }
	field(t, r, "sandbox", &sb)
	if sb.TenantID != "other" || sb.ProjectID != "proj" {
		t.Errorf("got %s:%s, want other:proj", sb.TenantID, sb.ProjectID)
	}
	if p := e.fake.LastPrincipal(); p.Key != "platform" || p.Scope() != "other:proj" {
		t.Errorf("got principal %+v, want the platform key acting for other:proj", p)
	}
}

func TestSandboxQuery(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	r := e.post(t, apitest.UserKey, `query($id: ID!) { sandbox(id: $id) { `+sandboxFields+` } }`, map[string]any{"id": apitest.SandboxRunning})
	noErrors(t, r)
	var sb map[string]any
	field(t, r, "sandbox", &sb)
	want := map[string]any{
		"id": apitest.SandboxRunning, "tenantId": "acme", "projectId": "web", "state": "RUNNING", "stateReason": nil,
		"createdAt": "2025-01-02T03:04:05Z", "stateChangedAt": "2025-01-02T03:04:06Z", "autostopSec": 1800.0,
		"ttlSec": 3600.0, "expiresAt": "2025-01-02T04:04:05Z", "latestSnapshotId": nil, "network": "none",
		"resources": map[string]any{"milliCpu": 2000.0, "memoryBytes": float64(4 << 30), "diskBytes": float64(10 << 30)},
	}
	for k, v := range want {
		if got := sb[k]; !equalJSON(got, v) {
			t.Errorf("%s: got %v, want %v", k, got, v)
		}
	}
}

func TestErrorCodes(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	tests := []struct {
		name, query string
		wantCode    string
		wantMessage string
		wantExt     map[string]any
		wantPath    string
	}{
		{name: "not-found", query: `{ sandbox(id: "sbx_other") { id } }`, wantCode: "NOT_FOUND",
			wantMessage: "sandbox sbx_other not found", wantPath: "sandbox"},
		{name: "busy-has-retry-after", query: `mutation { startSandbox(id: "` + apitest.SandboxBusy + `") { sandbox { id } } }`, wantCode: "INVALID_STATE",
			wantExt: map[string]any{"retryAfter": 2.0, "state": "STOPPING"}, wantPath: "startSandbox"},
		{name: "uncoded-error-is-internal", query: `mutation { stopSandbox(id: "` + apitest.SandboxBoom + `") { sandbox { id } } }`, wantCode: "INTERNAL",
			wantMessage: "internal error", wantPath: "stopSandbox"},
		{name: "panic-is-internal", query: `{ sandbox(id: "` + apitest.SandboxPanic + `") { id } }`, wantCode: "INTERNAL",
			wantMessage: "internal error", wantPath: "sandbox"},
		{name: "parse", query: `{ sandbox(id: `, wantCode: "GRAPHQL_PARSE_FAILED"},
		{name: "validation", query: `{ sandbox(id: "x") { nope } }`, wantCode: "GRAPHQL_VALIDATION_FAILED"},
		{name: "bad-enum", query: `{ sandboxes(state: SLEEPING) { nodes { id } } }`, wantCode: "GRAPHQL_VALIDATION_FAILED"},
		{name: "first-zero", query: `{ sandboxes(first: 0) { nodes { id } } }`, wantCode: "INVALID_ARGUMENT",
			wantExt: map[string]any{"field": "first"}},
		{name: "mode-out-of-range", query: `mutation { writeFile(sandboxId: "` + apitest.SandboxRunning + `", path: "a", content: "x", mode: 4095) { file { path } } }`,
			wantCode: "INVALID_ARGUMENT", wantExt: map[string]any{"field": "mode"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.post(t, apitest.UserKey, tt.query, nil)
			if len(r.Errors) != 1 {
				t.Fatalf("got %d errors, want 1: %+v", len(r.Errors), r.Errors)
			}
			if got := r.code(0); got != tt.wantCode {
				t.Errorf("got code %q, want %q (%+v)", got, tt.wantCode, r.Errors[0])
			}
			if tt.wantMessage != "" && r.Errors[0].Message != tt.wantMessage {
				t.Errorf("got message %q, want %q", r.Errors[0].Message, tt.wantMessage)
			}
			for k, v := range tt.wantExt {
				if got := r.Errors[0].Extensions[k]; !equalJSON(got, v) {
					t.Errorf("extensions.%s: got %v, want %v", k, got, v)
				}
			}
			if _, ok := r.Errors[0].Extensions["retryAfter"]; ok && tt.wantExt["retryAfter"] == nil {
				t.Errorf("got retryAfter %v, want none", r.Errors[0].Extensions["retryAfter"])
			}
			if tt.wantPath != "" && (len(r.Errors[0].Path) != 1 || r.Errors[0].Path[0] != tt.wantPath) {
				t.Errorf("got path %v, want [%s]", r.Errors[0].Path, tt.wantPath)
			}
			if strings.Contains(r.Errors[0].Message, "hunter2") {
				t.Errorf("the cause leaked to the client: %q", r.Errors[0].Message)
			}
		})
	}
	logs := e.logs.String()
	if !strings.Contains(logs, apitest.SecretCause) {
		t.Errorf("the internal error's cause was not logged; logs:\n%s", logs)
	}
	if !strings.Contains(logs, "graphql: panic") {
		t.Errorf("the panic was not logged; logs:\n%s", logs)
	}
}

func TestNullableRootKeepsData(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	r := e.post(t, apitest.UserKey, `{ missing: sandbox(id: "sbx_x") { id } profiles { name } }`, nil)
	if r.code(0) != "NOT_FOUND" {
		t.Fatalf("got %+v, want NOT_FOUND", r.Errors)
	}
	if got := string(r.Data["missing"]); got != "null" {
		t.Errorf("got missing = %s, want null", got)
	}
	var ps []map[string]any
	field(t, r, "profiles", &ps)
	if len(ps) != 1 {
		t.Errorf("got profiles %v, want one", ps)
	}
}

func TestComplexityLimit(t *testing.T) {
	e := newEnv(t, HandlerOptions{ComplexityLimit: 10})
	var q strings.Builder
	q.WriteString("{")
	for _, a := range []string{"a", "b", "c", "d"} {
		q.WriteString(a + `: sandbox(id: "` + apitest.SandboxRunning + `") { id state profileName } `)
	}
	q.WriteString("}")
	r := e.post(t, apitest.UserKey, q.String(), nil)
	if got := r.code(0); got != "COST_EXCEEDED" {
		t.Fatalf("got %q (%+v), want COST_EXCEEDED", got, r.Errors)
	}
	if calls := e.fake.Called(); len(calls) != 0 {
		t.Errorf("got service calls %v, want none", calls)
	}
}

// GraphiQL's introspection query must fit the default complexity limit.
func TestIntrospectionFitsDefaultLimit(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	r := e.post(t, apitest.UserKey, introspectionQuery, nil)
	noErrors(t, r)
	var schema struct {
		Types []struct{ Name string } `json:"types"`
	}
	field(t, r, "__schema", &schema)
	var names []string
	for _, ty := range schema.Types {
		names = append(names, ty.Name)
	}
	for _, want := range []string{"Sandbox", "SandboxEvent", "Int64", "Time"} {
		if !contains(names, want) {
			t.Errorf("introspection has no type %s", want)
		}
	}
}

func TestExec(t *testing.T) {
	const q = `mutation($in: ExecInput!) { exec(sandboxId: "` + apitest.SandboxRunning + `", input: $in) { exec {
		execId exitCode signal timedOut durationMs startedAt endedAt stdout stderr stdoutBase64 stderrBase64
		stdoutTruncated stderrTruncated error } } }`
	t.Run("both-stdins", func(t *testing.T) {
		e := newEnv(t, HandlerOptions{})
		r := e.post(t, apitest.UserKey, q, map[string]any{"in": map[string]any{"command": []string{"cat"}, "stdin": "a", "stdinBase64": "YQ=="}})
		if got := r.code(0); got != "INVALID_ARGUMENT" {
			t.Errorf("got %q (%+v), want INVALID_ARGUMENT", got, r.Errors)
		}
		if calls := e.fake.Called(); len(calls) != 0 {
			t.Errorf("got service calls %v, want none", calls)
		}
	})
	t.Run("bad-base64", func(t *testing.T) {
		e := newEnv(t, HandlerOptions{})
		r := e.post(t, apitest.UserKey, q, map[string]any{"in": map[string]any{"command": []string{"cat"}, "stdinBase64": "%%%"}})
		if got := r.code(0); got != "INVALID_ARGUMENT" {
			t.Errorf("got %q (%+v), want INVALID_ARGUMENT", got, r.Errors)
		}
	})
	t.Run("duplicate-env", func(t *testing.T) {
		e := newEnv(t, HandlerOptions{})
		r := e.post(t, apitest.UserKey, q, map[string]any{"in": map[string]any{"command": []string{"env"},
			"env": []map[string]string{{"name": "A", "value": "1"}, {"name": "A", "value": "2"}}}})
		if got := r.code(0); got != "INVALID_ARGUMENT" {
			t.Errorf("got %q (%+v), want INVALID_ARGUMENT", got, r.Errors)
		}
	})
	t.Run("ok", func(t *testing.T) {
		e := newEnv(t, HandlerOptions{})
		e.fake.ExecStdout = []byte("ok \xff\xfe end")
		r := e.post(t, apitest.UserKey, q, map[string]any{"in": map[string]any{"command": []string{"cat"}, "stdinBase64": "AAEC",
			"timeoutSec": 30, "cwd": "/workspace/src", "env": []map[string]string{{"name": "A", "value": "1"}}}})
		noErrors(t, r)
		var res map[string]any
		field(t, r, "exec.exec", &res)
		want := map[string]any{"execId": "exec_1", "exitCode": 3.0, "signal": nil, "timedOut": false, "durationMs": 1500.0,
			"startedAt": "2025-01-02T03:04:05Z", "endedAt": "2025-01-02T03:04:06.5Z", "stdout": "ok \uFFFD\uFFFD end",
			"stdoutBase64": base64.StdEncoding.EncodeToString(e.fake.ExecStdout), "stderr": "warn\n",
			"stdoutTruncated": true, "stderrTruncated": false, "error": nil}
		for k, v := range want {
			if got := res[k]; !equalJSON(got, v) {
				t.Errorf("%s: got %v, want %v", k, got, v)
			}
		}
		req := e.fake.Last("Exec").Exec
		if !bytes.Equal(req.Stdin, []byte{0, 1, 2}) || req.Cwd != "/workspace/src" || req.TimeoutSec == nil ||
			*req.TimeoutSec != 30 || req.Env["A"] != "1" || len(req.Command) != 1 {
			t.Errorf("got request %+v, want stdin 000102, cwd, timeout 30, env A=1", req)
		}
	})
}

func TestCreateSandbox(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	r := e.post(t, apitest.UserKey, `mutation { createSandbox(input: {autostopSec: 60, env: [{name: "X", value: "y"}]}) { sandbox { id profileName } } }`, nil)
	noErrors(t, r)
	req := e.fake.Last("Create").Create
	if req.Profile != "" || req.AutostopSec == nil || *req.AutostopSec != 60 || req.TTLSec != nil || req.Env["X"] != "y" {
		t.Errorf("got request %+v, want default profile, autostop 60, no ttl, env X=y", req)
	}
}

func TestDestroySandbox(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	r := e.post(t, apitest.UserKey, `mutation { destroySandbox(id: "`+apitest.SandboxRunning+`") { snapshotId sandbox { state } } }`, nil)
	noErrors(t, r)
	var res struct {
		SnapshotID string `json:"snapshotId"`
		Sandbox    struct{ State string }
	}
	field(t, r, "destroySandbox", &res)
	if res.SnapshotID != apitest.SnapDestroyed || res.Sandbox.State != "DESTROYED" {
		t.Errorf("got %+v, want %s and DESTROYED", res, apitest.SnapDestroyed)
	}
}

func TestSandboxesConnection(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	r := e.post(t, apitest.UserKey, `{ sandboxes(first: 2, after: "sbx_prev", state: RUNNING) {
		edges { cursor node { id } } nodes { id } pageInfo { hasNextPage hasPreviousPage startCursor endCursor } } }`, nil)
	noErrors(t, r)
	var c struct {
		Edges []struct {
			Cursor string
			Node   struct{ ID string }
		}
		Nodes    []struct{ ID string }
		PageInfo struct {
			HasNextPage, HasPreviousPage bool
			StartCursor, EndCursor       string
		}
	}
	field(t, r, "sandboxes", &c)
	if len(c.Edges) != 2 || len(c.Nodes) != 2 || c.Edges[0].Cursor != c.Edges[0].Node.ID || c.Nodes[1].ID != c.Edges[1].Node.ID {
		t.Errorf("got %+v, want two edges whose cursors are their ids", c)
	}
	if !c.PageInfo.HasNextPage || c.PageInfo.HasPreviousPage || c.PageInfo.StartCursor != c.Edges[0].Cursor ||
		c.PageInfo.EndCursor != c.Edges[1].Cursor {
		t.Errorf("got pageInfo %+v", c.PageInfo)
	}
	if o := e.fake.Last("List").List; o.Limit != 2 || o.After != "sbx_prev" || o.State != "RUNNING" {
		t.Errorf("got list options %+v, want limit 2 after sbx_prev state RUNNING", o)
	}
	r = e.post(t, apitest.UserKey, `{ sandboxes { nodes { id } } }`, nil)
	noErrors(t, r)
	if o := e.fake.Last("List").List; o.Limit != 50 || o.After != "" || o.State != "" {
		t.Errorf("got default list options %+v, want limit 50", o)
	}
}

func TestFiles(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	t.Run("read-text", func(t *testing.T) {
		e.fake.File = []byte("héllo\n")
		r := e.post(t, apitest.UserKey, `{ readFile(sandboxId: "`+apitest.SandboxRunning+`", path: "a.txt") { path content contentBase64 size truncated file { name mode modTime } } }`, nil)
		noErrors(t, r)
		var fc map[string]any
		field(t, r, "readFile", &fc)
		want := map[string]any{"path": "/workspace/a.txt", "content": "héllo\n", "contentBase64": base64.StdEncoding.EncodeToString(e.fake.File),
			"size": 7.0, "truncated": false, "file": map[string]any{"name": "a.txt", "mode": 420.0, "modTime": "2025-01-02T03:04:05Z"}}
		for k, v := range want {
			if got := fc[k]; !equalJSON(got, v) {
				t.Errorf("%s: got %v, want %v", k, got, v)
			}
		}
		if got := e.fake.Last("ReadFile").MaxBytes; got != 10<<20 {
			t.Errorf("got maxBytes %d, want 10 MiB", got)
		}
	})
	t.Run("read-binary", func(t *testing.T) {
		e.fake.File = []byte{0xff, 0x00}
		r := e.post(t, apitest.UserKey, `{ readFile(sandboxId: "`+apitest.SandboxRunning+`", path: "b") { content contentBase64 } }`, nil)
		noErrors(t, r)
		var fc map[string]any
		field(t, r, "readFile", &fc)
		if fc["content"] != nil || fc["contentBase64"] != "/wA=" {
			t.Errorf("got %v, want content null and contentBase64 /wA=", fc)
		}
	})
	t.Run("read-too-large", func(t *testing.T) {
		e.fake.File = make([]byte, 10<<20+1)
		r := e.post(t, apitest.UserKey, `{ readFile(sandboxId: "`+apitest.SandboxRunning+`", path: "big") { size } }`, nil)
		if got := r.code(0); got != "PAYLOAD_TOO_LARGE" {
			t.Errorf("got %q, want PAYLOAD_TOO_LARGE", got)
		}
	})
	t.Run("write", func(t *testing.T) {
		const q = `mutation($c: String, $b: String, $m: Int) { writeFile(sandboxId: "` + apitest.SandboxRunning + `", path: "x", content: $c, contentBase64: $b, mode: $m) { file { path size mode } } }`
		tests := []struct {
			name     string
			vars     map[string]any
			wantCode string
			want     []byte
		}{
			{name: "neither", vars: map[string]any{}, wantCode: "INVALID_ARGUMENT"},
			{name: "both", vars: map[string]any{"c": "a", "b": "YQ=="}, wantCode: "INVALID_ARGUMENT"},
			{name: "text", vars: map[string]any{"c": "hi", "m": 0o600}, want: []byte("hi")},
			{name: "base64", vars: map[string]any{"b": "AP8="}, want: []byte{0, 0xff}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				before := len(e.fake.CallsTo("WriteFile"))
				r := e.post(t, apitest.UserKey, q, tt.vars)
				if got := r.code(0); got != tt.wantCode {
					t.Fatalf("got code %q, want %q (%+v)", got, tt.wantCode, r.Errors)
				}
				var written []byte
				if writes := e.fake.CallsTo("WriteFile"); len(writes) > before {
					written = writes[len(writes)-1].Data
				}
				if tt.wantCode == "" && !bytes.Equal(written, tt.want) {
					t.Errorf("got written %q, want %q", written, tt.want)
				}
			})
		}
		if mode := e.fake.Last("WriteFile").Mode; mode != 0 {
			t.Errorf("got mode %o for the last write, want 0 (the service's default)", mode)
		}
	})
	t.Run("list", func(t *testing.T) {
		r := e.post(t, apitest.UserKey, `{ listFiles(sandboxId: "`+apitest.SandboxRunning+`", first: 2) {
			path edges { cursor node { name } } nodes { name isDir symlink modTime } pageInfo { hasNextPage startCursor endCursor } } }`, nil)
		noErrors(t, r)
		var l struct {
			Path  string
			Edges []struct {
				Cursor string
				Node   struct{ Name string }
			}
			Nodes    []map[string]any
			PageInfo struct {
				HasNextPage            bool
				StartCursor, EndCursor string
			}
		}
		field(t, r, "listFiles", &l)
		if l.Path != "." || len(l.Nodes) != 2 || l.Nodes[0]["symlink"] != "src" ||
			l.Nodes[0]["modTime"] != nil || l.Nodes[1]["isDir"] != true {
			t.Errorf("got %+v", l)
		}
		// Each edge's cursor is the service's cursor of its name; the page's ends are the
		// first and last edges', and hasNextPage is the service's next cursor.
		if len(l.Edges) != 2 || l.Edges[0].Cursor != sandbox.FileCursor("link") || l.Edges[1].Cursor != sandbox.FileCursor("src") ||
			l.PageInfo.StartCursor != l.Edges[0].Cursor || l.PageInfo.EndCursor != l.Edges[1].Cursor || !l.PageInfo.HasNextPage {
			t.Errorf("got edges %+v page %+v, want the names' cursors and a next page", l.Edges, l.PageInfo)
		}
		if c := e.fake.Last("FilePage"); c.Path != "." || c.Limit != 2 || c.After != "" {
			t.Errorf("got path %q limit %d after %q, want ., 2 and none", c.Path, c.Limit, c.After)
		}
		// Without first: the default page of 1000.
		r = e.post(t, apitest.UserKey, `{ listFiles(sandboxId: "`+apitest.SandboxRunning+`") { path } }`, nil)
		noErrors(t, r)
		if c := e.fake.Last("FilePage"); c.Limit != 1000 {
			t.Errorf("got limit %d, want the default 1000", c.Limit)
		}
		r = e.post(t, apitest.UserKey, `{ listFiles(sandboxId: "`+apitest.SandboxRunning+`", path: "src", first: 5, after: "f1.c3Jj") { path } }`, nil)
		noErrors(t, r)
		if c := e.fake.Last("FilePage"); c.Path != "src" || c.Limit != 5 || c.After != "f1.c3Jj" {
			t.Errorf("got path %q limit %d after %q, want src, 5 and the cursor passed on", c.Path, c.Limit, c.After)
		}
	})
}

func TestGET(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	get := func(query string) gqlResponse {
		req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/graphql?query="+url.QueryEscape(query), nil)
		req.Header.Set(auth.HeaderAPIKey, apitest.UserKey)
		return e.do(t, req)
	}
	r := get(`{ profiles { name default } }`)
	noErrors(t, r)
	r = get(`mutation { stopSandbox(id: "` + apitest.SandboxRunning + `") { sandbox { id } } }`)
	if len(r.Errors) == 0 || r.Status == 200 {
		t.Errorf("got status %d %+v, want a mutation over GET refused", r.Status, r.Errors)
	}
	if calls := e.fake.Called(); contains(calls, "Stop") {
		t.Errorf("a GET ran a mutation: %v", calls)
	}
}

func TestBodyLimit(t *testing.T) {
	e := newEnv(t, HandlerOptions{MaxBodyBytes: 1024})
	r := e.post(t, apitest.UserKey, `mutation { writeFile(sandboxId: "`+apitest.SandboxRunning+`", path: "x", content: "`+strings.Repeat("a", 2000)+`") { file { size } } }`, nil)
	if r.Status != http.StatusRequestEntityTooLarge || r.code(0) != "PAYLOAD_TOO_LARGE" {
		t.Errorf("got %d %+v, want 413 PAYLOAD_TOO_LARGE", r.Status, r.Errors)
	}
	// A chunked body (no Content-Length) is bounded too.
	body := io.MultiReader(strings.NewReader(`{"query":"{ profiles { name } }","x":"`), strings.NewReader(strings.Repeat("a", 2000)+`"}`))
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/graphql", body)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(auth.HeaderAPIKey, apitest.UserKey)
	if r := e.do(t, req); r.Status != http.StatusRequestEntityTooLarge {
		t.Errorf("got %d, want 413", r.Status)
	}
}

func TestSubscriptionOverPlainPOSTIsRefused(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	r := e.post(t, apitest.UserKey, `subscription { sandboxEvents { cursor } }`, nil)
	if got := r.code(0); got != "INVALID_ARGUMENT" {
		t.Errorf("got %q (%+v), want INVALID_ARGUMENT", got, r.Errors)
	}
	if calls := e.fake.Called(); len(calls) != 0 {
		t.Errorf("got service calls %v, want none", calls)
	}
}

// TestOptionsNeedsNoKey: a plain OPTIONS (not a CORS preflight, which is answered before the
// handler) learns the methods and never reaches GraphQL.
func TestOptionsNeedsNoKey(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	req, _ := http.NewRequest(http.MethodOptions, e.srv.URL+"/graphql", nil)
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent || !strings.Contains(resp.Header.Get("Allow"), "POST") {
		t.Errorf("got %d Allow=%q, want 204 with POST allowed", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

func equalJSON(got, want any) bool {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for k, v := range w {
			if !equalJSON(g[k], v) {
				return false
			}
		}
		return true
	default:
		return got == want
	}
}

// introspectionQuery is the query GraphiQL sends to load the schema.
const introspectionQuery = `query IntrospectionQuery {
  __schema {
    queryType { name } mutationType { name } subscriptionType { name }
    types { ...FullType }
    directives { name description locations args { ...InputValue } }
  }
}
fragment FullType on __Type {
  kind name description
  fields(includeDeprecated: true) { name description args { ...InputValue } type { ...TypeRef } isDeprecated deprecationReason }
  inputFields { ...InputValue }
  interfaces { ...TypeRef }
  enumValues(includeDeprecated: true) { name description isDeprecated deprecationReason }
  possibleTypes { ...TypeRef }
}
fragment InputValue on __InputValue { name description type { ...TypeRef } defaultValue }
fragment TypeRef on __Type {
  kind name
  ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name } } } } } } }
}`

func TestCloseReasonIsBounded(t *testing.T) {
	reason := closeReason(apierror.New(apierror.Unauthenticated, "%s", strings.Repeat("é", 100)))
	if len(reason) > 123 || !utf8.ValidString(reason) || !strings.HasPrefix(reason, "UNAUTHENTICATED: é") {
		t.Errorf("got reason %q (%d bytes), want valid UTF-8 of at most 123 bytes", reason, len(reason))
	}
}
