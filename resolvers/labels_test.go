package resolvers

import (
	"maps"
	"testing"

	"sandboxd/internal/api/apitest"
)

// TestLabelsGraphQL: createSandbox's labels reach the service and come back sorted;
// sandboxes' labels filter is ANDed and checked; updateSandbox passes a merge patch on.
func TestLabelsGraphQL(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	type label struct{ Key, Value string }
	var sb struct {
		ID     string
		Labels []label
	}
	r := e.post(t, apitest.UserKey, `mutation { createSandbox(input: {labels: [{key: "team", value: "ml"}, {key: "example.com/tier", value: "gold"}]}) { sandbox { id labels { key value } } } }`, nil)
	noErrors(t, r)
	field(t, r, "createSandbox.sandbox", &sb)
	if len(sb.Labels) != 2 || sb.Labels[0] != (label{"example.com/tier", "gold"}) || sb.Labels[1] != (label{"team", "ml"}) {
		t.Fatalf("got labels %+v, want both sorted by key", sb.Labels)
	}
	if got := e.fake.Last("Create").Create.Labels; !maps.Equal(got, map[string]string{"team": "ml", "example.com/tier": "gold"}) {
		t.Fatalf("the service got %v", got)
	}
	r = e.post(t, apitest.UserKey, `mutation { createSandbox(input: {labels: [{key: "a", value: "1"}, {key: "a", value: "2"}]}) { sandbox { id } } }`, nil)
	if r.code(0) != "INVALID_ARGUMENT" {
		t.Fatalf("a key twice: got %+v, want INVALID_ARGUMENT", r.Errors)
	}

	// A sandbox without labels has an empty list, never null.
	r = e.post(t, apitest.UserKey, `{ sandbox(id: "`+apitest.SandboxRunning+`") { labels { key } } }`, nil)
	noErrors(t, r)
	if string(r.Data["sandbox"]) != `{"labels":[]}` {
		t.Fatalf("got %s, want an empty list", r.Data["sandbox"])
	}

	r = e.post(t, apitest.UserKey, `{ sandboxes(labels: [{key: "team", value: "ml"}, {key: "env", value: ""}]) { nodes { id } } }`, nil)
	noErrors(t, r)
	if got := e.fake.Last("List").List.Labels; !maps.Equal(got, map[string]string{"team": "ml", "env": ""}) {
		t.Fatalf("the service got the filter %v", got)
	}
	calls := len(e.fake.CallsTo("List"))
	for _, q := range []string{
		`{ sandboxes(labels: [{key: "team", value: "ml"}, {key: "team", value: "web"}]) { nodes { id } } }`,
		`{ sandboxes(labels: [{key: "sandboxd.io/tenant", value: "acme"}]) { nodes { id } } }`,
		`{ sandboxes(labels: [{key: "bad key", value: "x"}]) { nodes { id } } }`,
	} {
		if r := e.post(t, apitest.UserKey, q, nil); r.code(0) != "INVALID_ARGUMENT" {
			t.Errorf("%s: got %+v, want INVALID_ARGUMENT", q, r.Errors)
		}
	}
	if n := len(e.fake.CallsTo("List")); n != calls {
		t.Fatalf("refused filters reached the service (%d calls, want %d)", n, calls)
	}

	r = e.post(t, apitest.UserKey, `mutation($id: ID!) { updateSandbox(id: $id, input: {labels: [{key: "team", value: "web"}, {key: "old", value: null}], autostopSec: 60, ttlSec: 7200}) { sandbox { id autostopSec ttlSec expiresAt labels { key value } } } }`,
		map[string]any{"id": apitest.SandboxRunning})
	noErrors(t, r)
	var up struct {
		AutostopSec, TTLSec int
		ExpiresAt           string
		Labels              []label
	}
	field(t, r, "updateSandbox.sandbox", &up)
	if up.AutostopSec != 60 || up.TTLSec != 7200 || up.ExpiresAt != "2025-01-02T05:04:05Z" || len(up.Labels) != 1 || up.Labels[0] != (label{"team", "web"}) {
		t.Fatalf("got %+v, want the update applied with its new expiry", up)
	}
	c := e.fake.Last("Update")
	if v, ok := c.Update.Labels["old"]; c.SandboxID != apitest.SandboxRunning || !ok || v != nil || *c.Update.Labels["team"] != "web" || c.Update.ClearLabels {
		t.Fatalf("the service got %+v", c)
	}
	r = e.post(t, apitest.UserKey, `mutation { updateSandbox(id: "`+apitest.SandboxRunning+`", input: {clearLabels: true}) { sandbox { id } } }`, nil)
	noErrors(t, r)
	if c := e.fake.Last("Update").Update; !c.ClearLabels || c.Labels != nil || c.TTLSec != nil {
		t.Fatalf("clear: the service got %+v", c)
	}
	r = e.post(t, apitest.UserKey, `mutation { updateSandbox(id: "`+apitest.SandboxRunning+`", input: {labels: [{key: "a", value: "1"}, {key: "a", value: null}]}) { sandbox { id } } }`, nil)
	if r.code(0) != "INVALID_ARGUMENT" {
		t.Fatalf("a key twice: got %+v, want INVALID_ARGUMENT", r.Errors)
	}
	r = e.post(t, apitest.UserKey, `mutation { updateSandbox(id: "sbx_other", input: {ttlSec: 100}) { sandbox { id } } }`, nil)
	if r.code(0) != "NOT_FOUND" {
		t.Fatalf("another tenant's sandbox: got %+v, want NOT_FOUND", r.Errors)
	}
}

// TestLabelsArePriced: a sandbox's labels cost like a list of the label limit, so a big page
// of sandboxes with their labels is refused before it runs, and a smaller one fits.
func TestLabelsArePriced(t *testing.T) {
	e := newEnv(t, HandlerOptions{MaxLabels: 32})
	r := e.post(t, apitest.UserKey, `{ sandboxes(first: 500) { nodes { id labels { key value } } } }`, nil)
	if r.code(0) != "COST_EXCEEDED" {
		t.Fatalf("500 sandboxes with labels: got %+v, want COST_EXCEEDED", r.Errors)
	}
	noErrors(t, e.post(t, apitest.UserKey, `{ sandboxes(first: 100) { nodes { id labels { key value } } } }`, nil))
}
