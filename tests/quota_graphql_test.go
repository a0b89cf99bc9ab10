package tests

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

// TestQuotaGraphQL: the quota query answers limit and use; createSandbox on a full project is
// an error with extensions.code QUOTA_EXCEEDED and extensions.retryAfter. The default limit here
// comes from the environment (SANDBOX_CONCURRENCY_LIMIT=1 over the config file's 0).
func TestQuotaGraphQL(t *testing.T) {
	e2e.RequireComponents(t)
	rs := redistest.Start(t)
	s := e2e.StartServer(t, e2e.ServerOptions{RedisURL: rs.URL, Env: []string{"SANDBOX_CONCURRENCY_LIMIT=1"}})
	const gqlQuota = `{ quota { limit inUse } }`
	type gqlQuotaJSON struct {
		Limit int `json:"limit"`
		InUse int `json:"inUse"`
	}
	quota := func(key string) gqlQuotaJSON {
		t.Helper()
		var q gqlQuotaJSON
		s.GQL(t, gqlQuota, nil, key).OK(t, "quota", &q)
		return q
	}
	if q := quota(e2e.HdrTenant1); q != (gqlQuotaJSON{Limit: 1}) {
		t.Fatalf("quota of an empty project: got %+v, want limit 1 (SANDBOX_CONCURRENCY_LIMIT), inUse 0", q)
	}
	id := s.Create(t, e2e.CreateBody, e2e.HdrTenant1).SandboxID
	if q := quota(e2e.HdrTenant1); q != (gqlQuotaJSON{Limit: 1, InUse: 1}) {
		t.Errorf("quota with one RUNNING sandbox: got %+v, want limit 1, inUse 1", q)
	}
	if q := s.Quota(t, e2e.HdrTenant1); q != (e2e.QuotaJSON{Limit: 1, InUse: 1}) {
		t.Errorf("REST quota with one RUNNING sandbox: got %+v, want limit 1, in_use 1", q)
	}
	if q := quota(e2e.HdrTenant2); q != (gqlQuotaJSON{Limit: 1}) {
		t.Errorf("quota of another tenant: got %+v, want limit 1, inUse 0", q)
	}

	t.Run("createSandbox-full", func(t *testing.T) {
		g := s.GQL(t, gqlCreate, map[string]any{"in": map[string]any{"profile": "sandboxes-default"}}, e2e.HdrTenant1)
		if raw, ok := g.Data["createSandbox"]; ok && string(raw) != "null" {
			var made gqlSandbox
			if json.Unmarshal(raw, &made) == nil && made.ID != "" {
				s.Track(made.ID, e2e.HdrTenant1)
			}
			t.Fatalf("%s: got a sandbox, want QUOTA_EXCEEDED", g)
		}
		g.WantCode(t, 0, "QUOTA_EXCEEDED")
		if len(g.Errors) > 0 {
			ra, ok := g.Errors[0].Extensions["retryAfter"].(float64)
			if !ok || ra <= 0 || ra != float64(int(ra)) {
				t.Errorf("%s: got extensions.retryAfter %v, want a positive whole number of seconds", g, g.Errors[0].Extensions["retryAfter"])
			}
		}
	})
	t.Run("rest-create-full", func(t *testing.T) {
		r := s.Curl(t, http.MethodPost, e2e.Prefix, []byte(e2e.CreateBody), e2e.HdrJSON, e2e.HdrTenant1)
		if p := quotaExceededProblem(r, 1); p != "" {
			t.Error(p)
		}
	})
	t.Run("autostopAt-expiresAt", func(t *testing.T) {
		var sb struct {
			State      string     `json:"state"`
			CreatedAt  time.Time  `json:"createdAt"`
			TTLSec     int        `json:"ttlSec"`
			ExpiresAt  *time.Time `json:"expiresAt"`
			AutostopAt *time.Time `json:"autostopAt"`
		}
		s.GQL(t, `query($id: ID!) { sandbox(id: $id) { state createdAt ttlSec expiresAt autostopAt } }`,
			map[string]any{"id": id}, e2e.HdrTenant1).OK(t, "sandbox", &sb)
		if sb.State != "RUNNING" || sb.AutostopAt == nil {
			t.Errorf("got state %s autostopAt %v, want a RUNNING sandbox's autostopAt", sb.State, sb.AutostopAt)
		}
		if want := sb.CreatedAt.Add(time.Duration(sb.TTLSec) * time.Second); sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(want) {
			t.Errorf("got expiresAt %v, want createdAt + ttlSec = %s", sb.ExpiresAt, want)
		}
	})
	var res struct {
		Sandbox struct {
			State string `json:"state"`
		} `json:"sandbox"`
	}
	s.GQL(t, gqlDestroy, map[string]any{"id": id}, e2e.HdrTenant1).OK(t, "destroySandbox", &res)
	if q := quota(e2e.HdrTenant1); q != (gqlQuotaJSON{Limit: 1}) {
		t.Errorf("quota after destroySandbox: got %+v, want limit 1, inUse 0", q)
	}
}
