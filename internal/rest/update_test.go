package rest

import (
	"encoding/json"
	"maps"
	"net/http"
	"strings"
	"testing"

	"sandboxd/internal/api/apitest"
)

// TestCreateWithLabels: "labels" of a create reaches the service; a sandbox's JSON always has
// a labels object.
func TestCreateWithLabels(t *testing.T) {
	f := apitest.New()
	h := newTestHandler(t, f)
	rec := serve(t, h, http.MethodPost, Prefix, `{"labels":{"team":"ml","example.com/tier":"gold"}}`)
	if rec.Code != http.StatusCreated {
		t.Fatalf("got %d %s, want 201", rec.Code, rec.Body)
	}
	want := map[string]string{"team": "ml", "example.com/tier": "gold"}
	if got := f.CallsTo("Create")[0].Create.Labels; !maps.Equal(got, want) {
		t.Fatalf("the service got labels %v, want %v", got, want)
	}
	var out struct {
		Labels map[string]string `json:"labels"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || !maps.Equal(out.Labels, want) {
		t.Fatalf("answer: got %s, want the labels", rec.Body)
	}
	rec = serve(t, h, http.MethodGet, Prefix+"/"+apitest.SandboxRunning, "")
	if !strings.Contains(rec.Body.String(), `"labels":{}`) {
		t.Fatalf("a sandbox without labels: got %s, want \"labels\":{}", rec.Body)
	}
	rec = serve(t, h, http.MethodPost, Prefix, `{"labels":{"team":1}}`)
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "labels") {
		t.Fatalf("a label that is not a string: got %d %s, want 400 naming labels", rec.Code, rec.Body)
	}
}

// TestListLabelFilter: repeated label=key=value terms become one ANDed filter; a malformed
// one is INVALID_ARGUMENT before the service is called.
func TestListLabelFilter(t *testing.T) {
	f := apitest.New()
	h := newTestHandler(t, f)
	rec := serve(t, h, http.MethodGet, Prefix+"?label=team%3Dml&label=example.com/tier=gold&label=empty=", "")
	if rec.Code != http.StatusOK {
		t.Fatalf("got %d %s, want 200", rec.Code, rec.Body)
	}
	want := map[string]string{"team": "ml", "example.com/tier": "gold", "empty": ""}
	if got := f.CallsTo("List")[0].List.Labels; !maps.Equal(got, want) {
		t.Fatalf("the service got %v, want %v", got, want)
	}
	many := strings.Repeat("&label=a=b", 33)
	for _, q := range []string{"label=team", "label==x", "label=team=ml&label=team=web", "label=sandboxd.io/tenant=t1",
		"label=team=" + strings.Repeat("x", 64), "label=a%20b=c", many[1:]} {
		rec := serve(t, h, http.MethodGet, Prefix+"?"+q, "")
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), `"code":"INVALID_ARGUMENT"`) {
			t.Errorf("%.60s: got %d %s, want 400 INVALID_ARGUMENT", q, rec.Code, rec.Body)
		}
	}
	if n := len(f.CallsTo("List")); n != 1 {
		t.Fatalf("got %d List calls, want only the good one", n)
	}
}

// TestUpdateBody: PATCH is a JSON merge patch: labels with null values remove, "labels": null
// clears, absent fields are absent; unknown fields and non-objects are refused.
func TestUpdateBody(t *testing.T) {
	f := apitest.New()
	h := newTestHandler(t, f)
	path := Prefix + "/" + apitest.SandboxRunning
	rec := serve(t, h, http.MethodPatch, path, `{"labels":{"team":"web","old":null},"autostop_sec":60,"ttl_sec":7200}`)
	if rec.Code != http.StatusOK {
		t.Fatalf("got %d %s, want 200", rec.Code, rec.Body)
	}
	call := f.CallsTo("Update")[0]
	if call.SandboxID != apitest.SandboxRunning || *call.Update.AutostopSec != 60 || *call.Update.TTLSec != 7200 || call.Update.ClearLabels {
		t.Fatalf("the service got %+v", call)
	}
	if v, ok := call.Update.Labels["old"]; !ok || v != nil || *call.Update.Labels["team"] != "web" || len(call.Update.Labels) != 2 {
		t.Fatalf("the service got the patch %v, want team=web and old removed", call.Update.Labels)
	}
	var out struct {
		Labels      map[string]string `json:"labels"`
		AutostopSec int64             `json:"autostop_sec"`
		TTLSec      int64             `json:"ttl_sec"`
		ExpiresAt   string            `json:"expires_at"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Labels["team"] != "web" || out.AutostopSec != 60 ||
		out.TTLSec != 7200 || out.ExpiresAt != "2025-01-02T05:04:05Z" {
		t.Fatalf("answer: got %s, want the updated sandbox with its new expiry", rec.Body)
	}

	rec = serve(t, h, http.MethodPatch, path, `{"labels":null}`)
	if c := f.CallsTo("Update")[1].Update; rec.Code != http.StatusOK || !c.ClearLabels || len(c.Labels) != 0 {
		t.Fatalf("labels null: got %d, %+v, want every label cleared", rec.Code, c)
	}
	rec = serve(t, h, http.MethodPatch, path, `{"ttl_sec":100}`)
	if c := f.CallsTo("Update")[2].Update; rec.Code != http.StatusOK || c.Labels != nil || c.ClearLabels || c.AutostopSec != nil {
		t.Fatalf("ttl only: got %d, %+v, want labels and autostop absent", rec.Code, c)
	}
	for _, body := range []string{`{"state":"RUNNING"}`, `{"labels":["a"]}`, `{"labels":{"a":1}}`, `{"ttl_sec":"1"}`, `[]`, ``, `{} {}`} {
		rec := serve(t, h, http.MethodPatch, path, body)
		if rec.Code != http.StatusBadRequest {
			t.Errorf("%q: got %d %s, want 400", body, rec.Code, rec.Body)
		}
	}
	if n := len(f.CallsTo("Update")); n != 3 {
		t.Fatalf("got %d Update calls, want 3 (refused bodies never reach the service)", n)
	}
	rec = serve(t, h, http.MethodPatch, Prefix+"/sbx_other", `{"ttl_sec":100}`)
	if rec.Code != http.StatusNotFound {
		t.Fatalf("another tenant's sandbox: got %d %s, want 404", rec.Code, rec.Body)
	}
}
