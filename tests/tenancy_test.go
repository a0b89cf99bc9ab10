package tests

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"sandboxd/internal/auth"
)

// unknownID is a well-formed sandbox id that no test creates.
const unknownID = "sbx_01ARZ3NDEKTSV4RRFFQ69G5FAV"

// restVerb is one REST call on an existing sandbox.
type restVerb struct {
	name, method, path, body string
}

func restVerbs() []restVerb {
	return []restVerb{
		{"get", http.MethodGet, "", ""},
		{"exec", http.MethodPost, "/exec", `{"command":["bash","-c","echo intruder > intruder.txt"]}`},
		{"stop", http.MethodPost, "/stop", ""},
		{"start", http.MethodPost, "/start", ""},
		{"delete", http.MethodDelete, "", ""},
		{"files-download", http.MethodGet, "/files?path=notes.txt", ""},
		{"files-upload-put", http.MethodPut, "/files?path=intruder.txt", "intruder\n"},
		{"files-upload-post", http.MethodPost, "/files?path=intruder.txt", "intruder\n"},
		{"files-list", http.MethodGet, "/files/list", ""},
	}
}

func (v restVerb) send(t *testing.T, s *Server, id string, headers ...string) *Response {
	t.Helper()
	var body []byte
	if v.body != "" {
		body = []byte(v.body)
	}
	if v.name == "exec" {
		headers = append(headers, hdrJSON)
	}
	return s.curl(t, v.method, prefix+"/"+id+v.path, body, headers...)
}

// testTenancyREST: tenant1's sandbox does not exist for tenant2 on any verb (the same answer as
// an id nobody has), a platform key acts for t1/p1 only with the scope headers.
func (e *apiEnv) testTenancyREST(t *testing.T) {
	s, id := e.s, e.id
	for _, v := range restVerbs() {
		t.Run("tenant2-"+v.name, func(t *testing.T) {
			r := v.send(t, s, id, hdrTenant2)
			got := r.wantError(t, http.StatusNotFound, "NOT_FOUND")
			// Indistinguishable from a sandbox that does not exist at all.
			other := v.send(t, s, unknownID, hdrTenant2)
			var want apiError
			if json.Unmarshal(other.Body, &want) == nil && other.Status == r.Status &&
				strings.ReplaceAll(got.Error.Message, id, unknownID) != want.Error.Message {
				t.Errorf("got message %q for another tenant's sandbox and %q for an unknown one, want the same",
					got.Error.Message, want.Error.Message)
			}
		})
	}
	t.Run("tenant2-list", func(t *testing.T) {
		if _, ok := s.list(t, hdrTenant2).find(id); ok {
			t.Errorf("tenant2's list: got %s, want it absent", id)
		}
	})
	t.Run("platform-without-scope", func(t *testing.T) {
		s.curl(t, http.MethodGet, prefix+"/"+id, nil, hdrPlatform).wantError(t, http.StatusNotFound, "NOT_FOUND")
	})
	t.Run("platform-with-other-scope", func(t *testing.T) {
		s.curl(t, http.MethodGet, prefix+"/"+id, nil, hdrPlatform, "X-Sandbox-Tenant-Id: t2", "X-Sandbox-Project-Id: p1").
			wantError(t, http.StatusNotFound, "NOT_FOUND")
		s.curl(t, http.MethodGet, prefix+"/"+id, nil, hdrPlatform, "X-Sandbox-Tenant-Id: t1", "X-Sandbox-Project-Id: p2").
			wantError(t, http.StatusNotFound, "NOT_FOUND")
	})
	t.Run("platform-with-scope", func(t *testing.T) {
		scope := []string{hdrPlatform, "X-Sandbox-Tenant-Id: t1", "X-Sandbox-Project-Id: p1"}
		sb := s.get(t, id, scope...)
		if sb.State != "RUNNING" || sb.TenantID != "t1" || sb.ProjectID != "p1" {
			t.Errorf("got %+v, want t1:p1's RUNNING sandbox", sb)
		}
		if _, ok := s.list(t, scope...).find(id); !ok {
			t.Errorf("platform list for t1/p1: got no %s, want it", id)
		}
		if out := s.run(t, id, []string{"cat", "notes.txt"}, scope...); out != "tenant1 notes\n" {
			t.Errorf("platform exec: got %q, want tenant1's notes", out)
		}
	})
	t.Run("platform-with-half-scope", func(t *testing.T) {
		s.curl(t, http.MethodGet, prefix+"/"+id, nil, hdrPlatform, "X-Sandbox-Tenant-Id: t1").
			wantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "X-Sandbox-Project-Id")
	})
	t.Run("user-key-with-scope-headers", func(t *testing.T) {
		scope := []string{"X-Sandbox-Tenant-Id: t1", "X-Sandbox-Project-Id: p1"}
		s.curl(t, http.MethodGet, prefix+"/"+id, nil, append([]string{hdrTenant2}, scope...)...).
			wantError(t, http.StatusForbidden, "PERMISSION_DENIED")
		s.curl(t, http.MethodGet, prefix, nil, append([]string{hdrTenant2}, scope...)...).
			wantError(t, http.StatusForbidden, "PERMISSION_DENIED")
		s.curl(t, http.MethodPost, prefix+"/"+id+"/exec", []byte(`{"command":["true"]}`), append([]string{hdrTenant2, hdrJSON}, scope...)...).
			wantError(t, http.StatusForbidden, "PERMISSION_DENIED")
	})
	t.Run("owner-unaffected", func(t *testing.T) {
		if st := s.get(t, id, hdrTenant1).State; st != "RUNNING" {
			t.Errorf("got state %q, want RUNNING (tenant2's stop and delete did nothing)", st)
		}
		s.curl(t, http.MethodGet, prefix+"/"+id+"/files?path=intruder.txt", nil, hdrTenant1).
			wantError(t, http.StatusNotFound, "NOT_FOUND")
		if got := s.download(t, id, "notes.txt", hdrTenant1); got != "tenant1 notes\n" {
			t.Errorf("got notes.txt %q, want tenant1's notes", got)
		}
	})
}

// testTenancyGraphQL: the same through GraphQL.
func (e *apiEnv) testTenancyGraphQL(t *testing.T) {
	s, id := e.s, e.id
	ops := []struct {
		name, query string
		vars        map[string]any
	}{
		{"sandbox", gqlGet, map[string]any{"id": id}},
		{"exec", gqlExec, map[string]any{"id": id, "in": map[string]any{"command": []string{"bash", "-c", "echo intruder > intruder.txt"}}}},
		{"stopSandbox", gqlStop, map[string]any{"id": id}},
		{"startSandbox", gqlStart, map[string]any{"id": id}},
		{"destroySandbox", gqlDestroy, map[string]any{"id": id}},
		{"readFile", gqlRead, map[string]any{"id": id, "path": "notes.txt"}},
		{"writeFile", gqlWrite, map[string]any{"id": id, "path": "intruder.txt", "content": "intruder"}},
		{"listFiles", gqlListFiles, map[string]any{"id": id}},
	}
	for _, op := range ops {
		t.Run("tenant2-"+op.name, func(t *testing.T) {
			g := s.gql(t, op.query, op.vars, hdrTenant2)
			g.wantCode(t, http.StatusOK, "NOT_FOUND")
			for field, raw := range g.Data {
				if string(raw) != "null" {
					t.Errorf("%s: got data.%s %s, want null", g, field, raw)
				}
			}
		})
	}
	t.Run("tenant2-sandboxes", func(t *testing.T) {
		var conn struct {
			Nodes []gqlSandbox `json:"nodes"`
		}
		s.gql(t, gqlList, nil, hdrTenant2).ok(t, "sandboxes", &conn)
		for _, n := range conn.Nodes {
			if n.ID == id {
				t.Errorf("tenant2's sandboxes: got %s, want it absent", id)
			}
		}
	})
	t.Run("tenant2-subscription", func(t *testing.T) {
		// Over SSE, a subscription to another tenant's sandbox answers NOT_FOUND.
		events, closeStream := s.sse(t, hdrTenant2, map[string]any{"id": id, "after": "0-0"})
		defer closeStream()
		m, ok := <-events
		if !ok || len(m.Errors) == 0 || m.Errors[0].code() != "NOT_FOUND" {
			t.Errorf("got %+v (open %v), want one NOT_FOUND error", m, ok)
		}
	})
	t.Run("platform-with-scope", func(t *testing.T) {
		scope := []string{hdrPlatform, "X-Sandbox-Tenant-Id: t1", "X-Sandbox-Project-Id: p1"}
		var sb gqlSandbox
		s.gql(t, gqlGet, map[string]any{"id": id}, scope...).ok(t, "sandbox", &sb)
		if sb.ID != id || sb.State != "RUNNING" || sb.TenantID != "t1" {
			t.Errorf("got %+v, want t1's RUNNING sandbox", sb)
		}
		if out := s.gqlExecOK(t, id, []string{"cat", "notes.txt"}, scope...); out != "tenant1 notes\n" {
			t.Errorf("platform exec: got %q, want tenant1's notes", out)
		}
	})
	t.Run("platform-without-scope", func(t *testing.T) {
		s.gql(t, gqlGet, map[string]any{"id": id}, hdrPlatform).wantCode(t, http.StatusOK, "NOT_FOUND")
	})
	t.Run("user-key-with-scope-headers", func(t *testing.T) {
		s.gql(t, gqlGet, map[string]any{"id": id}, hdrTenant2, "X-Sandbox-Tenant-Id: t1", "X-Sandbox-Project-Id: p1").
			wantCode(t, http.StatusForbidden, "PERMISSION_DENIED")
	})
	t.Run("owner-unaffected", func(t *testing.T) {
		var sb gqlSandbox
		s.gql(t, gqlGet, map[string]any{"id": id}, hdrTenant1).ok(t, "sandbox", &sb)
		if sb.State != "RUNNING" {
			t.Errorf("got state %q, want RUNNING", sb.State)
		}
		s.gql(t, gqlRead, map[string]any{"id": id, "path": "intruder.txt"}, hdrTenant1).wantCode(t, http.StatusOK, "NOT_FOUND")
	})
}

// testAuth: a missing key and an unknown key are 401 UNAUTHENTICATED in both APIs, before
// anything else is looked at.
func (e *apiEnv) testAuth(t *testing.T) {
	s, id := e.s, e.id
	keys := []struct {
		name    string
		headers []string
		mention string
	}{
		{"missing-key", nil, "X-Api-Key"},
		{"empty-key", []string{"X-Api-Key: "}, "X-Api-Key"},
		{"unknown-key", []string{"X-Api-Key: not-a-key-of-this-server"}, "unknown"},
		{"key-hash-as-key", []string{"X-Api-Key: " + auth.HashKey(keyTenant1)}, "unknown"},
	}
	for _, k := range keys {
		t.Run("rest-"+k.name, func(t *testing.T) {
			s.curl(t, http.MethodGet, prefix, nil, k.headers...).wantError(t, http.StatusUnauthorized, "UNAUTHENTICATED", k.mention)
			s.curl(t, http.MethodGet, prefix+"/"+id, nil, k.headers...).wantError(t, http.StatusUnauthorized, "UNAUTHENTICATED")
			s.curl(t, http.MethodPost, prefix, []byte(`{"profile":"sandboxes-default"}`), append([]string{hdrJSON}, k.headers...)...).
				wantError(t, http.StatusUnauthorized, "UNAUTHENTICATED")
			s.curl(t, http.MethodPost, prefix+"/"+id+"/exec", []byte(`{"command":["true"]}`), append([]string{hdrJSON}, k.headers...)...).
				wantError(t, http.StatusUnauthorized, "UNAUTHENTICATED")
		})
		t.Run("graphql-"+k.name, func(t *testing.T) {
			s.gql(t, gqlGet, map[string]any{"id": id}, k.headers...).wantCode(t, http.StatusUnauthorized, "UNAUTHENTICATED")
			s.gql(t, `query { profiles { name } }`, nil, k.headers...).wantCode(t, http.StatusUnauthorized, "UNAUTHENTICATED")
		})
	}
}
