package tests

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"sandboxd/internal/auth"
	"sandboxd/tests/e2e"
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
		{"update", http.MethodPatch, "", `{"labels":{"intruder":"yes"},"ttl_sec":60}`},
	}
}

func (v restVerb) send(t *testing.T, s *e2e.Server, id string, headers ...string) *e2e.Response {
	t.Helper()
	var body []byte
	if v.body != "" {
		body = []byte(v.body)
	}
	if v.name == "exec" {
		headers = append(headers, e2e.HdrJSON)
	}
	return s.Curl(t, v.method, e2e.Prefix+"/"+id+v.path, body, headers...)
}

// testTenancyREST: tenant1's sandbox does not exist for tenant2 on any verb (the same answer as
// an id nobody has), a platform key acts for t1/p1 only with the scope headers.
func (e *apiEnv) testTenancyREST(t *testing.T) {
	s, id := e.s, e.id
	for _, v := range restVerbs() {
		t.Run("tenant2-"+v.name, func(t *testing.T) {
			r := v.send(t, s, id, e2e.HdrTenant2)
			got := r.WantError(t, http.StatusNotFound, "NOT_FOUND")
			// Indistinguishable from a sandbox that does not exist at all.
			other := v.send(t, s, unknownID, e2e.HdrTenant2)
			var want e2e.APIError
			if json.Unmarshal(other.Body, &want) == nil && other.Status == r.Status &&
				strings.ReplaceAll(got.Error.Message, id, unknownID) != want.Error.Message {
				t.Errorf("got message %q for another tenant's sandbox and %q for an unknown one, want the same",
					got.Error.Message, want.Error.Message)
			}
		})
	}
	t.Run("tenant2-list", func(t *testing.T) {
		if _, ok := s.List(t, e2e.HdrTenant2).Find(id); ok {
			t.Errorf("tenant2's list: got %s, want it absent", id)
		}
	})
	t.Run("platform-without-scope", func(t *testing.T) {
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id, nil, e2e.HdrPlatform).WantError(t, http.StatusNotFound, "NOT_FOUND")
	})
	t.Run("platform-with-other-scope", func(t *testing.T) {
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id, nil, e2e.HdrPlatform, "X-Sandbox-Tenant-Id: t2", "X-Sandbox-Project-Id: p1").
			WantError(t, http.StatusNotFound, "NOT_FOUND")
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id, nil, e2e.HdrPlatform, "X-Sandbox-Tenant-Id: t1", "X-Sandbox-Project-Id: p2").
			WantError(t, http.StatusNotFound, "NOT_FOUND")
	})
	t.Run("platform-with-scope", func(t *testing.T) {
		scope := []string{e2e.HdrPlatform, "X-Sandbox-Tenant-Id: t1", "X-Sandbox-Project-Id: p1"}
		sb := s.Get(t, id, scope...)
		if sb.State != "RUNNING" || sb.TenantID != "t1" || sb.ProjectID != "p1" {
			t.Errorf("got %+v, want t1:p1's RUNNING sandbox", sb)
		}
		if _, ok := s.List(t, scope...).Find(id); !ok {
			t.Errorf("platform list for t1/p1: got no %s, want it", id)
		}
		if out := s.Run(t, id, []string{"cat", "notes.txt"}, scope...); out != "tenant1 notes\n" {
			t.Errorf("platform exec: got %q, want tenant1's notes", out)
		}
	})
	t.Run("platform-with-half-scope", func(t *testing.T) {
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id, nil, e2e.HdrPlatform, "X-Sandbox-Tenant-Id: t1").
			WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "X-Sandbox-Project-Id")
	})
	t.Run("user-key-with-scope-headers", func(t *testing.T) {
		scope := []string{"X-Sandbox-Tenant-Id: t1", "X-Sandbox-Project-Id: p1"}
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id, nil, append([]string{e2e.HdrTenant2}, scope...)...).
			WantError(t, http.StatusForbidden, "PERMISSION_DENIED")
		s.Curl(t, http.MethodGet, e2e.Prefix, nil, append([]string{e2e.HdrTenant2}, scope...)...).
			WantError(t, http.StatusForbidden, "PERMISSION_DENIED")
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/exec", []byte(`{"command":["true"]}`), append([]string{e2e.HdrTenant2, e2e.HdrJSON}, scope...)...).
			WantError(t, http.StatusForbidden, "PERMISSION_DENIED")
	})
	t.Run("owner-unaffected", func(t *testing.T) {
		if sb := s.Get(t, id, e2e.HdrTenant1); sb.State != "RUNNING" || sb.TTLSec == 60 {
			t.Errorf("got state %q, ttl_sec %d, want RUNNING and the ttl untouched (tenant2's stop, delete and update did nothing)", sb.State, sb.TTLSec)
		}
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/files?path=intruder.txt", nil, e2e.HdrTenant1).
			WantError(t, http.StatusNotFound, "NOT_FOUND")
		if got := s.Download(t, id, "notes.txt", e2e.HdrTenant1); got != "tenant1 notes\n" {
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
		{"updateSandbox", `mutation($id: ID!) { updateSandbox(id: $id, input: {labels: [{key: "intruder", value: "yes"}], ttlSec: 60}) { sandbox { id } } }`,
			map[string]any{"id": id}},
	}
	for _, op := range ops {
		t.Run("tenant2-"+op.name, func(t *testing.T) {
			g := s.GQL(t, op.query, op.vars, e2e.HdrTenant2)
			g.WantCode(t, http.StatusOK, "NOT_FOUND")
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
		s.GQL(t, gqlList, nil, e2e.HdrTenant2).OK(t, "sandboxes", &conn)
		for _, n := range conn.Nodes {
			if n.ID == id {
				t.Errorf("tenant2's sandboxes: got %s, want it absent", id)
			}
		}
	})
	t.Run("tenant2-subscription", func(t *testing.T) {
		// Over SSE, a subscription to another tenant's sandbox answers NOT_FOUND.
		events, closeStream := sse(t, s, e2e.HdrTenant2, map[string]any{"id": id, "after": "0-0"})
		defer closeStream()
		m, ok := <-events
		if !ok || len(m.Errors) == 0 || m.Errors[0].Code() != "NOT_FOUND" {
			t.Errorf("got %+v (open %v), want one NOT_FOUND error", m, ok)
		}
	})
	t.Run("platform-with-scope", func(t *testing.T) {
		scope := []string{e2e.HdrPlatform, "X-Sandbox-Tenant-Id: t1", "X-Sandbox-Project-Id: p1"}
		var sb gqlSandbox
		s.GQL(t, gqlGet, map[string]any{"id": id}, scope...).OK(t, "sandbox", &sb)
		if sb.ID != id || sb.State != "RUNNING" || sb.TenantID != "t1" {
			t.Errorf("got %+v, want t1's RUNNING sandbox", sb)
		}
		if out := gqlExecOK(t, s, id, []string{"cat", "notes.txt"}, scope...); out != "tenant1 notes\n" {
			t.Errorf("platform exec: got %q, want tenant1's notes", out)
		}
	})
	t.Run("platform-without-scope", func(t *testing.T) {
		s.GQL(t, gqlGet, map[string]any{"id": id}, e2e.HdrPlatform).WantCode(t, http.StatusOK, "NOT_FOUND")
	})
	t.Run("user-key-with-scope-headers", func(t *testing.T) {
		s.GQL(t, gqlGet, map[string]any{"id": id}, e2e.HdrTenant2, "X-Sandbox-Tenant-Id: t1", "X-Sandbox-Project-Id: p1").
			WantCode(t, http.StatusForbidden, "PERMISSION_DENIED")
	})
	t.Run("owner-unaffected", func(t *testing.T) {
		var sb gqlSandbox
		s.GQL(t, gqlGet, map[string]any{"id": id}, e2e.HdrTenant1).OK(t, "sandbox", &sb)
		if sb.State != "RUNNING" {
			t.Errorf("got state %q, want RUNNING", sb.State)
		}
		s.GQL(t, gqlRead, map[string]any{"id": id, "path": "intruder.txt"}, e2e.HdrTenant1).WantCode(t, http.StatusOK, "NOT_FOUND")
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
		{"key-hash-as-key", []string{"X-Api-Key: " + auth.HashKey(e2e.KeyTenant1)}, "unknown"},
	}
	for _, k := range keys {
		t.Run("rest-"+k.name, func(t *testing.T) {
			s.Curl(t, http.MethodGet, e2e.Prefix, nil, k.headers...).WantError(t, http.StatusUnauthorized, "UNAUTHENTICATED", k.mention)
			s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id, nil, k.headers...).WantError(t, http.StatusUnauthorized, "UNAUTHENTICATED")
			s.Curl(t, http.MethodPost, e2e.Prefix, []byte(`{"profile":"sandboxes-default"}`), append([]string{e2e.HdrJSON}, k.headers...)...).
				WantError(t, http.StatusUnauthorized, "UNAUTHENTICATED")
			s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/exec", []byte(`{"command":["true"]}`), append([]string{e2e.HdrJSON}, k.headers...)...).
				WantError(t, http.StatusUnauthorized, "UNAUTHENTICATED")
		})
		t.Run("graphql-"+k.name, func(t *testing.T) {
			s.GQL(t, gqlGet, map[string]any{"id": id}, k.headers...).WantCode(t, http.StatusUnauthorized, "UNAUTHENTICATED")
			s.GQL(t, `query { profiles { name } }`, nil, k.headers...).WantCode(t, http.StatusUnauthorized, "UNAUTHENTICATED")
		})
	}
}
