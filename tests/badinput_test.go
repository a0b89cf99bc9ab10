package tests

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"sandboxd/tests/e2e"
)

// badCase is one bad REST request and the error it must get.
type badCase struct {
	name    string
	method  string
	path    string
	body    string
	headers []string
	// chunked sends the body without a Content-Length.
	chunked bool
	status  int
	code    string
	mention []string
}

// testBadInputsREST sends bad requests: each gets 400 INVALID_ARGUMENT (413, 404 where said)
// with a message naming the problem, never a 500.
func (e *apiEnv) testBadInputsREST(t *testing.T) {
	s, id := e.s, e.id
	sbx := e2e.Prefix + "/" + id
	exec := sbx + "/exec"
	const bad, big, nf = http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusNotFound
	const ia, ptl, nfc = "INVALID_ARGUMENT", "PAYLOAD_TOO_LARGE", "NOT_FOUND"
	post := http.MethodPost
	overBody := `{"command":["true"],"stdin":"` + strings.Repeat("a", 8<<20) + `"}`
	overStdin := `{"command":["true"],"stdin":"` + strings.Repeat("a", 4<<20+1) + `"}`
	overFile := strings.Repeat("x", apiMaxFile+1)

	cases := []badCase{
		// create
		{name: "create-malformed-json", method: post, path: e2e.Prefix, body: `{"profile": "sandboxes-default",`, status: bad, code: ia, mention: []string{"JSON"}},
		{name: "create-not-json", method: post, path: e2e.Prefix, body: `profile=sandboxes-default`, status: bad, code: ia, mention: []string{"JSON"}},
		{name: "create-empty-body", method: post, path: e2e.Prefix, body: ``, status: bad, code: ia, mention: []string{"JSON"}},
		{name: "create-array-body", method: post, path: e2e.Prefix, body: `[]`, status: bad, code: ia, mention: []string{"JSON"}},
		{name: "create-unknown-field", method: post, path: e2e.Prefix, body: `{"profile":"sandboxes-default","profil":"x"}`, status: bad, code: ia, mention: []string{"profil"}},
		{name: "create-wrong-type", method: post, path: e2e.Prefix, body: `{"profile":"sandboxes-default","autostop_sec":"1800"}`, status: bad, code: ia, mention: []string{"autostop_sec"}},
		{name: "create-trailing-data", method: post, path: e2e.Prefix, body: `{"profile":"sandboxes-default"} {"ttl_sec":1}`, status: bad, code: ia, mention: []string{"JSON"}},
		{name: "create-unknown-profile", method: post, path: e2e.Prefix, body: `{"profile":"no-such-profile"}`, status: bad, code: ia, mention: []string{"no-such-profile"}},
		{name: "create-autostop-zero", method: post, path: e2e.Prefix, body: `{"autostop_sec":0}`, status: bad, code: ia, mention: []string{"autostop_sec"}},
		{name: "create-autostop-negative", method: post, path: e2e.Prefix, body: `{"autostop_sec":-5}`, status: bad, code: ia, mention: []string{"autostop_sec"}},
		{name: "create-autostop-too-large", method: post, path: e2e.Prefix, body: `{"autostop_sec":604801}`, status: bad, code: ia, mention: []string{"autostop_sec"}},
		{name: "create-ttl-zero", method: post, path: e2e.Prefix, body: `{"ttl_sec":0}`, status: bad, code: ia, mention: []string{"ttl_sec"}},
		{name: "create-ttl-too-large", method: post, path: e2e.Prefix, body: `{"ttl_sec":2592001}`, status: bad, code: ia, mention: []string{"ttl_sec"}},
		{name: "create-ttl-overflow", method: post, path: e2e.Prefix, body: `{"ttl_sec":100000000000000000000}`, status: bad, code: ia, mention: []string{"ttl_sec"}},
		{name: "create-env-bad-name", method: post, path: e2e.Prefix, body: `{"env":{"A=B":"x"}}`, status: bad, code: ia, mention: []string{"environment"}},
		// exec
		{name: "exec-malformed-json", method: post, path: exec, body: `{"command":["true"]`, status: bad, code: ia, mention: []string{"JSON"}},
		{name: "exec-unknown-field", method: post, path: exec, body: `{"command":["true"],"timeout":5}`, status: bad, code: ia, mention: []string{"timeout"}},
		{name: "exec-empty-command", method: post, path: exec, body: `{"command":[]}`, status: bad, code: ia, mention: []string{"command"}},
		{name: "exec-missing-command", method: post, path: exec, body: `{"timeout_sec":5}`, status: bad, code: ia, mention: []string{"command"}},
		{name: "exec-null-command", method: post, path: exec, body: `{"command":null}`, status: bad, code: ia, mention: []string{"command"}},
		{name: "exec-empty-program", method: post, path: exec, body: `{"command":[""]}`, status: bad, code: ia, mention: []string{"command"}},
		{name: "exec-command-wrong-type", method: post, path: exec, body: `{"command":"ls -la"}`, status: bad, code: ia, mention: []string{"command"}},
		{name: "exec-argument-wrong-type", method: post, path: exec, body: `{"command":["echo",1]}`, status: bad, code: ia, mention: []string{"command"}},
		{name: "exec-nul-in-argument", method: post, path: exec, body: `{"command":["echo","a\u0000b"]}`, status: bad, code: ia, mention: []string{"NUL"}},
		{name: "exec-timeout-zero", method: post, path: exec, body: `{"command":["true"],"timeout_sec":0}`, status: bad, code: ia, mention: []string{"timeout_sec"}},
		{name: "exec-timeout-negative", method: post, path: exec, body: `{"command":["true"],"timeout_sec":-1}`, status: bad, code: ia, mention: []string{"timeout_sec"}},
		{name: "exec-timeout-1e9", method: post, path: exec, body: `{"command":["true"],"timeout_sec":1000000000}`, status: bad, code: ia, mention: []string{"timeout_sec"}},
		{name: "exec-timeout-fraction", method: post, path: exec, body: `{"command":["true"],"timeout_sec":1.5}`, status: bad, code: ia, mention: []string{"timeout_sec"}},
		{name: "exec-stdin-and-stdin-base64", method: post, path: exec, body: `{"command":["cat"],"stdin":"a","stdin_base64":"YQ=="}`, status: bad, code: ia, mention: []string{"stdin", "stdin_base64"}},
		{name: "exec-stdin-bad-base64", method: post, path: exec, body: `{"command":["cat"],"stdin_base64":"%%%"}`, status: bad, code: ia, mention: []string{"stdin_base64"}},
		{name: "exec-env-bad-name", method: post, path: exec, body: `{"command":["true"],"env":{"":"x"}}`, status: bad, code: ia, mention: []string{"environment"}},
		{name: "exec-body-over-limit", method: post, path: exec, body: overBody, status: big, code: ptl},
		{name: "exec-stdin-over-limit", method: post, path: exec, body: overStdin, status: big, code: ptl, mention: []string{"stdin"}},
		// lifecycle verbs take no body
		{name: "stop-with-body", method: post, path: sbx + "/stop", body: `{"force":true}`, status: bad, code: ia, mention: []string{"body"}},
		{name: "start-with-body", method: post, path: sbx + "/start", body: `{"force":true}`, status: bad, code: ia, mention: []string{"body"}},
		// list
		{name: "list-limit-not-a-number", method: http.MethodGet, path: e2e.Prefix + "?limit=abc", status: bad, code: ia, mention: []string{"limit"}},
		{name: "list-limit-zero", method: http.MethodGet, path: e2e.Prefix + "?limit=0", status: bad, code: ia, mention: []string{"limit"}},
		{name: "list-limit-too-large", method: http.MethodGet, path: e2e.Prefix + "?limit=100000", status: bad, code: ia, mention: []string{"500"}},
		{name: "list-unknown-state", method: http.MethodGet, path: e2e.Prefix + "?state=sleeping", status: bad, code: ia, mention: []string{"state"}},
		{name: "list-bad-cursor", method: http.MethodGet, path: e2e.Prefix + "?cursor=not-a-cursor", status: bad, code: ia, mention: []string{"cursor"}},
		// sandbox ids that cannot exist
		{name: "get-bad-id-shape", method: http.MethodGet, path: e2e.Prefix + "/not-a-sandbox-id", status: nf, code: nfc},
		{name: "get-lowercase-id", method: http.MethodGet, path: e2e.Prefix + "/" + strings.ToLower(id), status: nf, code: nfc},
		{name: "get-unknown-id", method: http.MethodGet, path: e2e.Prefix + "/sbx_00000000000000000000000000", status: nf, code: nfc},
		{name: "exec-bad-id-shape", method: post, path: e2e.Prefix + "/sbx_123/exec", body: `{"command":["true"]}`, status: nf, code: nfc},
		{name: "stop-bad-id-shape", method: post, path: e2e.Prefix + "/xyz/stop", status: nf, code: nfc},
		{name: "delete-bad-id-shape", method: http.MethodDelete, path: e2e.Prefix + "/xyz", status: nf, code: nfc},
		{name: "files-bad-id-shape", method: http.MethodGet, path: e2e.Prefix + "/xyz/files?path=a", status: nf, code: nfc},
		{name: "unknown-sub-path", method: http.MethodGet, path: sbx + "/nope", status: nf, code: nfc},
		// files
		{name: "files-download-escape", method: http.MethodGet, path: sbx + "/files?path=../../etc/passwd", status: bad, code: ia, mention: []string{"workspace"}},
		{name: "files-download-absolute-outside", method: http.MethodGet, path: sbx + "/files?path=/etc/passwd", status: bad, code: ia, mention: []string{"workspace"}},
		{name: "files-upload-escape", method: http.MethodPut, path: sbx + "/files?path=../../etc/passwd", body: "owned\n", status: bad, code: ia, mention: []string{"workspace"}},
		{name: "files-upload-escape-post", method: post, path: sbx + "/files?path=sub/../../../etc/passwd", body: "owned\n", status: bad, code: ia, mention: []string{"workspace"}},
		{name: "files-list-escape", method: http.MethodGet, path: sbx + "/files/list?path=../..", status: bad, code: ia, mention: []string{"workspace"}},
		{name: "files-download-missing-path", method: http.MethodGet, path: sbx + "/files", status: bad, code: ia, mention: []string{"path"}},
		{name: "files-upload-missing-path", method: http.MethodPut, path: sbx + "/files", body: "x", status: bad, code: ia, mention: []string{"path"}},
		{name: "files-download-missing-file", method: http.MethodGet, path: sbx + "/files?path=no-such-file.txt", status: nf, code: nfc},
		{name: "files-upload-bad-mode", method: http.MethodPut, path: sbx + "/files?path=m.txt&mode=rwx", body: "x", status: bad, code: ia, mention: []string{"mode"}},
		{name: "files-upload-setuid-mode", method: http.MethodPut, path: sbx + "/files?path=m.txt&mode=4755", body: "x", status: bad, code: ia, mention: []string{"mode"}},
		{name: "files-list-bad-limit", method: http.MethodGet, path: sbx + "/files/list?limit=-1", status: bad, code: ia, mention: []string{"limit"}},
		{name: "files-upload-over-limit", method: http.MethodPut, path: sbx + "/files?path=big.bin", body: overFile, status: big, code: ptl},
		{name: "files-upload-over-limit-chunked", method: http.MethodPut, path: sbx + "/files?path=big.bin", body: overFile, chunked: true, status: big, code: ptl},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var body io.Reader
			if c.body != "" || c.method == post {
				body = bytes.NewReader([]byte(c.body))
				if c.chunked {
					body = io.MultiReader(body) // no length: sent chunked
				}
			}
			headers := append([]string{e2e.HdrTenant1}, c.headers...)
			if strings.HasSuffix(c.path, "/exec") || c.path == e2e.Prefix {
				headers = append(headers, e2e.HdrJSON)
			}
			r, err := s.Send(c.method, c.path, body, headers...)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status == http.StatusCreated {
				var sb e2e.SandboxJSON
				if json.Unmarshal(r.Body, &sb) == nil && sb.SandboxID != "" {
					s.Track(sb.SandboxID, e2e.HdrTenant1)
				}
			}
			r.WantError(t, c.status, c.code, c.mention...)
		})
	}
	t.Run("nothing-escaped", func(t *testing.T) {
		// The refused writes left nothing behind, in the workspace or outside it.
		out := s.Run(t, id, []string{"bash", "-c", "grep -c owned /etc/passwd; ls /workspace"}, e2e.HdrTenant1)
		if strings.Contains(out, "big.bin") || strings.Contains(out, "m.txt") || !strings.HasPrefix(out, "0\n") {
			t.Errorf("got %q, want no owned line in /etc/passwd and no big.bin or m.txt in the workspace", out)
		}
	})
	t.Run("sandbox-still-running", func(t *testing.T) {
		if st := s.Get(t, id, e2e.HdrTenant1).State; st != "RUNNING" {
			t.Errorf("got state %q, want RUNNING after the bad requests", st)
		}
	})
}

// testBadInputsGraphQL sends bad GraphQL operations: each gets an error with a code
// (INVALID_ARGUMENT, or gqlgen's validation code for a wrong type), never a 500.
func (e *apiEnv) testBadInputsGraphQL(t *testing.T) {
	s, id := e.s, e.id
	execIn := func(in map[string]any) map[string]any { return map[string]any{"id": id, "in": in} }
	cases := []struct {
		name    string
		query   string
		vars    map[string]any
		code    string
		mention []string
	}{
		{"create-unknown-profile", gqlCreate, map[string]any{"in": map[string]any{"profile": "no-such-profile"}}, "INVALID_ARGUMENT", []string{"no-such-profile"}},
		{"create-ttl-zero", gqlCreate, map[string]any{"in": map[string]any{"ttlSec": 0}}, "INVALID_ARGUMENT", []string{"ttl"}},
		{"create-autostop-negative", gqlCreate, map[string]any{"in": map[string]any{"autostopSec": -1}}, "INVALID_ARGUMENT", []string{"autostop"}},
		{"create-env-twice", gqlCreate, map[string]any{"in": map[string]any{"env": []map[string]any{{"name": "A", "value": "1"}, {"name": "A", "value": "2"}}}}, "INVALID_ARGUMENT", nil},
		{"exec-empty-command", gqlExec, execIn(map[string]any{"command": []string{}}), "INVALID_ARGUMENT", []string{"command"}},
		{"exec-timeout-zero", gqlExec, execIn(map[string]any{"command": []string{"true"}, "timeoutSec": 0}), "INVALID_ARGUMENT", []string{"timeout"}},
		{"exec-timeout-1e9", gqlExec, execIn(map[string]any{"command": []string{"true"}, "timeoutSec": 1000000000}), "INVALID_ARGUMENT", []string{"timeout"}},
		{"exec-stdin-twice", gqlExec, execIn(map[string]any{"command": []string{"cat"}, "stdin": "a", "stdinBase64": "YQ=="}), "INVALID_ARGUMENT", []string{"stdin"}},
		{"exec-timeout-wrong-type", gqlExec, execIn(map[string]any{"command": []string{"true"}, "timeoutSec": "soon"}), "", nil},
		{"exec-missing-command", gqlExec, execIn(map[string]any{"timeoutSec": 5}), "", nil},
		{"write-content-twice", `mutation($id: ID!) { writeFile(sandboxId: $id, path: "a.txt", content: "a", contentBase64: "YQ==") { file { path } } }`,
			map[string]any{"id": id}, "INVALID_ARGUMENT", []string{"content"}},
		{"write-escape", gqlWrite, map[string]any{"id": id, "path": "../../etc/passwd", "content": "owned"}, "INVALID_ARGUMENT", []string{"workspace"}},
		{"read-escape", gqlRead, map[string]any{"id": id, "path": "../../etc/passwd"}, "INVALID_ARGUMENT", []string{"workspace"}},
		{"read-absolute-outside", gqlRead, map[string]any{"id": id, "path": "/etc/passwd"}, "INVALID_ARGUMENT", []string{"workspace"}},
		{"list-files-first-zero", `query($id: ID!) { listFiles(sandboxId: $id, first: 0) { path } }`, map[string]any{"id": id}, "INVALID_ARGUMENT", []string{"first"}},
		{"sandboxes-first-zero", `query { sandboxes(first: 0) { nodes { id } } }`, nil, "INVALID_ARGUMENT", []string{"first"}},
		{"sandbox-bad-id-shape", gqlGet, map[string]any{"id": "not-a-sandbox-id"}, "NOT_FOUND", nil},
		{"syntax-error", `query { sandbox(id: "x" { id } }`, nil, "GRAPHQL_PARSE_FAILED", nil},
		{"unknown-field", `query { sandboxes { nodes { id colour } } }`, nil, "GRAPHQL_VALIDATION_FAILED", []string{"colour"}},
		{"subscription-over-plain-post", `subscription { sandboxEvents { cursor } }`, nil, "INVALID_ARGUMENT", []string{"WebSocket"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := s.GQL(t, c.query, c.vars, e2e.HdrTenant1)
			var made struct {
				Sandbox struct {
					ID string `json:"id"`
				} `json:"sandbox"`
			}
			if raw := g.Data["createSandbox"]; raw != nil && json.Unmarshal(raw, &made) == nil && made.Sandbox.ID != "" {
				s.Track(made.Sandbox.ID, e2e.HdrTenant1)
			}
			code := c.code
			if code == "" {
				// A variable of the wrong type or a missing required field is refused by
				// gqlgen's validation; any code is fine as long as there is one.
				if len(g.Errors) == 0 || g.Errors[0].Code() == "" {
					t.Errorf("%s: got no error code, want one", g)
					return
				}
				code = g.Errors[0].Code()
			}
			g.WantCode(t, 0, code, c.mention...)
		})
	}
	t.Run("malformed-json-body", func(t *testing.T) {
		// Like every other error, a body that is not JSON carries extensions.code.
		r := s.Curl(t, http.MethodPost, "/graphql", []byte(`{"query": "query { profiles { name } }"`), e2e.HdrJSON, e2e.HdrTenant1)
		g := &e2e.GQLResult{Resp: r}
		if err := json.Unmarshal(r.Body, g); err != nil {
			t.Fatalf("%s: decoding the answer: %v", r, err)
		}
		g.WantCode(t, http.StatusBadRequest, "INVALID_ARGUMENT", "JSON")
	})
	t.Run("body-over-limit", func(t *testing.T) {
		body := `{"query":"query { profiles { name } }","variables":{"pad":"` + strings.Repeat("a", 1<<20) + `"}}`
		r := s.Curl(t, http.MethodPost, "/graphql", []byte(body), e2e.HdrJSON, e2e.HdrTenant1)
		if r.Status != http.StatusRequestEntityTooLarge || !strings.Contains(string(r.Body), "PAYLOAD_TOO_LARGE") {
			t.Errorf("%s: got status %d, want 413 PAYLOAD_TOO_LARGE", r, r.Status)
		}
	})
}
