package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sandboxd/internal/kubetest"
	"sandboxd/internal/redistest"
	"sandboxd/runtime/kube"
	"sandboxd/tests/e2e"
)

// labeledJSON is a sandbox as REST answers it, with the fields this test is about.
type labeledJSON struct {
	SandboxID   string            `json:"sandbox_id"`
	State       string            `json:"state"`
	StateReason string            `json:"state_reason"`
	Labels      map[string]string `json:"labels"`
	AutostopSec int64             `json:"autostop_sec"`
	TTLSec      int64             `json:"ttl_sec"`
	CreatedAt   time.Time         `json:"created_at"`
	ExpiresAt   *time.Time        `json:"expires_at"`
	AutostopAt  *time.Time        `json:"autostop_at"`
}

type labeledList struct {
	Sandboxes  []labeledJSON `json:"sandboxes"`
	NextCursor string        `json:"next_cursor"`
}

// gqlSandboxLabels is a GraphQL sandbox with its labels.
type gqlSandboxLabels struct {
	ID          string `json:"id"`
	State       string `json:"state"`
	AutostopSec int64  `json:"autostopSec"`
	TTLSec      int64  `json:"ttlSec"`
	ExpiresAt   string `json:"expiresAt"`
	AutostopAt  string `json:"autostopAt"`
	Labels      []struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	} `json:"labels"`
}

func (g gqlSandboxLabels) labelMap() map[string]string {
	m := map[string]string{}
	for _, l := range g.Labels {
		m[l.Key] = l.Value
	}
	return m
}

// TestLabels: labels and updates end to end, on runsc and a real redis-server, through
// curl-shaped REST and GraphQL (HTTP and graphql-transport-ws): labels on create in both APIs,
// ANDed filters that page right across more sandboxes than a page, PATCH / updateSandbox of
// labels, autostop_sec and ttl_sec with the new deadlines and a SANDBOX_UPDATED event, the
// updated auto-stop honoured, limits and the reserved prefix refused (hostile sizes bounded),
// another tenant's sandbox NOT_FOUND, and the labels surviving a Redis FLUSHALL and a restart.
func TestLabels(t *testing.T) {
	e2e.RequireComponents(t)
	rs := redistest.Start(t)
	sd := e2e.NewStateDir(t)
	opts := e2e.ServerOptions{State: sd, RedisURL: rs.URL,
		Limits: map[string]any{"autostop_min_sec": 1, "ttl_min_sec": 1},
		Extra:  map[string]any{"reconcile_interval_ms": 300}}
	s := e2e.StartServer(t, opts)

	createREST := func(t *testing.T, body string, hdr string) labeledJSON {
		t.Helper()
		r := s.Curl(t, http.MethodPost, e2e.Prefix, []byte(body), e2e.HdrJSON, hdr)
		r.Want(t, http.StatusCreated)
		var sb labeledJSON
		r.Decode(t, &sb)
		s.Track(sb.SandboxID, hdr)
		return sb
	}
	listREST := func(t *testing.T, hdr string, q url.Values) labeledList {
		t.Helper()
		r := s.Curl(t, http.MethodGet, e2e.Prefix+"?"+q.Encode(), nil, hdr)
		r.Want(t, http.StatusOK)
		var l labeledList
		r.Decode(t, &l)
		return l
	}
	// pagesREST lists every page of a filter; it answers the ids and the size of each page.
	pagesREST := func(t *testing.T, hdr string, q url.Values) (ids []string, sizes []int) {
		t.Helper()
		for range 50 {
			l := listREST(t, hdr, q)
			for _, sb := range l.Sandboxes {
				ids = append(ids, sb.SandboxID)
			}
			sizes = append(sizes, len(l.Sandboxes))
			if l.NextCursor == "" {
				return ids, sizes
			}
			q.Set("cursor", l.NextCursor)
		}
		t.Fatal("the listing never ended")
		return nil, nil
	}

	// Five of tenant 1 (newest last), one of tenant 2 that matches the same filter.
	specs := []map[string]string{
		{"team": "ml", "env": "prod"},
		{"team": "ml", "env": "dev"},
		{"team": "ml", "env": "prod", "example.com/tier": "gold"},
		{"team": "web", "env": "prod"},
		{"team": "ml", "env": "prod"},
	}
	ids := make([]string, len(specs))
	e2e.Step(t, "create-with-labels", func(t *testing.T) {
		for i, labels := range specs[:4] {
			// curl -X POST -H 'Content-Type: application/json' -d '{"profile":…,"labels":{…}}' $URL/sandbox/sandboxes/v1
			sb := createREST(t, e2e.MustJSON(t, map[string]any{"profile": "sandboxes-default", "labels": labels}), e2e.HdrTenant1)
			if !maps.Equal(sb.Labels, labels) {
				t.Fatalf("create %d: got labels %v, want %v", i, sb.Labels, labels)
			}
			ids[i] = sb.SandboxID
		}
		// The fifth through GraphQL.
		g := s.GQL(t, `mutation($in: CreateSandboxInput!) { createSandbox(input: $in) { sandbox { id state labels { key value } } } }`,
			map[string]any{"in": map[string]any{"profile": "sandboxes-default",
				"labels": []map[string]string{{"key": "team", "value": "ml"}, {"key": "env", "value": "prod"}}}}, e2e.HdrTenant1)
		var sb gqlSandboxLabels
		g.OK(t, "createSandbox.sandbox", &sb)
		s.Track(sb.ID, e2e.HdrTenant1)
		if sb.State != "RUNNING" || !maps.Equal(sb.labelMap(), specs[4]) || sb.Labels[0].Key != "env" {
			t.Fatalf("createSandbox: got %+v, want RUNNING with env, team sorted", sb)
		}
		ids[4] = sb.ID
		other := createREST(t, `{"profile":"sandboxes-default","labels":{"team":"ml","env":"prod"}}`, e2e.HdrTenant2)
		if other.SandboxID == "" {
			t.Fatal("tenant 2's create answered no id")
		}
		// GET reports them; a sandbox without labels has an empty object.
		r := s.Curl(t, http.MethodGet, e2e.Prefix+"/"+ids[2], nil, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
		var got labeledJSON
		r.Decode(t, &got)
		if !maps.Equal(got.Labels, specs[2]) {
			t.Fatalf("GET: got labels %v, want %v", got.Labels, specs[2])
		}
	})

	e2e.Step(t, "create-refused", func(t *testing.T) {
		before, _ := pagesREST(t, e2e.HdrTenant1, url.Values{})
		many := map[string]string{}
		for i := range 33 {
			many[fmt.Sprintf("k%02d", i)] = "v"
		}
		huge := strings.Repeat("k", 1<<20)
		for name, tc := range map[string]struct {
			labels  any
			mention string
		}{
			"reserved":         {map[string]string{"sandboxd.io/tenant": "t2"}, "reserved"},
			"reserved-k8s":     {map[string]string{"app.kubernetes.io/managed-by": "me"}, "reserved"},
			"too-many":         {many, "at most 32"},
			"long-value":       {map[string]string{"team": strings.Repeat("v", 64)}, "label"},
			"bad-key":          {map[string]string{"a b": "v"}, "label key"},
			"slash-value":      {map[string]string{"team": "../../etc"}, "label"},
			"huge-key":         {map[string]string{huge: "v"}, "label key"},
			"not-a-string-map": {map[string]int{"team": 1}, "labels"},
		} {
			body := e2e.MustJSON(t, map[string]any{"profile": "sandboxes-default", "labels": tc.labels})
			r := s.Curl(t, http.MethodPost, e2e.Prefix, []byte(body), e2e.HdrJSON, e2e.HdrTenant1)
			e := r.WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", tc.mention)
			if n := len(e.Error.Message); n > 1024 {
				t.Errorf("%s: got a %d-byte message, want a bounded one", name, n)
			}
		}
		g := s.GQL(t, `mutation { createSandbox(input: {labels: [{key: "sandboxd.io/sandbox-id", value: "x"}]}) { sandbox { id } } }`, nil, e2e.HdrTenant1)
		g.WantCode(t, 0, "INVALID_ARGUMENT", "reserved")
		after, _ := pagesREST(t, e2e.HdrTenant1, url.Values{})
		if len(after) != len(before) {
			t.Fatalf("refused creates made sandboxes: %d before, %d after", len(before), len(after))
		}
	})

	// team=ml AND env=prod, newest first: 4, 2, 0 (tenant 2's never).
	want := []string{ids[4], ids[2], ids[0]}
	e2e.Step(t, "filter-pages", func(t *testing.T) {
		for _, limit := range []int{1, 2, 3} {
			q := url.Values{"label": {"team=ml", "env=prod"}, "limit": {fmt.Sprint(limit)}}
			got, sizes := pagesREST(t, e2e.HdrTenant1, q)
			if !slices.Equal(got, want) {
				t.Errorf("limit %d: got %v in pages %v, want %v", limit, got, sizes, want)
			}
		}
		got, _ := pagesREST(t, e2e.HdrTenant1, url.Values{"label": {"team=ml", "env=prod", "example.com/tier=gold"}})
		if !slices.Equal(got, []string{ids[2]}) {
			t.Errorf("three labels: got %v, want only %s", got, ids[2])
		}
		got, _ = pagesREST(t, e2e.HdrTenant1, url.Values{"label": {"team=ml"}, "state": {"RUNNING"}, "limit": {"2"}})
		if !slices.Equal(got, []string{ids[4], ids[2], ids[1], ids[0]}) {
			t.Errorf("team=ml and RUNNING: got %v", got)
		}
		got, _ = pagesREST(t, e2e.HdrTenant2, url.Values{"label": {"team=ml", "env=prod"}})
		if len(got) != 1 || slices.Contains(want, got[0]) {
			t.Errorf("tenant 2: got %v, want only its own sandbox", got)
		}
		// GraphQL: the same filter, one per page, following endCursor while hasNextPage.
		var gql []string
		var after any
		for range 10 {
			g := s.GQL(t, `query($after: String) { sandboxes(first: 1, after: $after, labels: [{key: "team", value: "ml"}, {key: "env", value: "prod"}]) {
				nodes { id labels { key value } } pageInfo { hasNextPage endCursor } } }`, map[string]any{"after": after}, e2e.HdrTenant1)
			var c struct {
				Nodes    []gqlSandboxLabels `json:"nodes"`
				PageInfo struct {
					HasNextPage bool    `json:"hasNextPage"`
					EndCursor   *string `json:"endCursor"`
				} `json:"pageInfo"`
			}
			g.OK(t, "sandboxes", &c)
			for _, n := range c.Nodes {
				gql = append(gql, n.ID)
				if l := n.labelMap(); l["team"] != "ml" || l["env"] != "prod" {
					t.Errorf("GraphQL: %s has labels %v", n.ID, l)
				}
			}
			if !c.PageInfo.HasNextPage {
				break
			}
			after = *c.PageInfo.EndCursor
		}
		if !slices.Equal(gql, want) {
			t.Errorf("GraphQL pages: got %v, want %v", gql, want)
		}
		for _, q := range []string{"label=team", "label=team=ml&label=team=web", "label=sandboxd.io/tenant=t1",
			"label=" + strings.Repeat("k", 5000) + "=v", strings.TrimPrefix(strings.Repeat("&label=a=b", 40), "&")} {
			r := s.Curl(t, http.MethodGet, e2e.Prefix+"?"+q, nil, e2e.HdrTenant1)
			r.WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT")
		}
		g := s.GQL(t, `{ sandboxes(labels: [{key: "team", value: "ml"}, {key: "team", value: "web"}]) { nodes { id } } }`, nil, e2e.HdrTenant1)
		g.WantCode(t, 0, "INVALID_ARGUMENT")
	})

	e2e.Step(t, "update", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// Follow the sandbox's events over graphql-transport-ws from the start of the stream.
		c := dialGraphQL(ctx, t, s)
		send(ctx, t, c, wsMsg{Type: "connection_init", Payload: rawJSON(t, map[string]any{"X-Api-Key": e2e.KeyTenant1})})
		if m := nextMsg(ctx, t, c); m.Type != "connection_ack" {
			t.Fatalf("got %s %s, want connection_ack", m.Type, m.Payload)
		}
		send(ctx, t, c, wsMsg{ID: "1", Type: "subscribe", Payload: rawJSON(t, map[string]any{
			"query": gqlEventsSub, "variables": map[string]any{"id": ids[0], "after": "0-0"}})})

		// curl -X PATCH -d '{"labels":{"env":"staging","team":null,"owner":"alice"},"autostop_sec":600,"ttl_sec":7200}' …/{id}
		at := time.Now()
		r := s.Curl(t, http.MethodPatch, e2e.Prefix+"/"+ids[0],
			[]byte(`{"labels":{"env":"staging","team":null,"owner":"alice"},"autostop_sec":600,"ttl_sec":7200}`), e2e.HdrJSON, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
		var sb labeledJSON
		r.Decode(t, &sb)
		if want := map[string]string{"env": "staging", "owner": "alice"}; !maps.Equal(sb.Labels, want) {
			t.Errorf("PATCH: got labels %v, want %v", sb.Labels, want)
		}
		if sb.AutostopSec != 600 || sb.TTLSec != 7200 || sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(sb.CreatedAt.Add(2*time.Hour)) {
			t.Errorf("PATCH: got autostop %d ttl %d expires %v, want 600, 7200, created_at+2h", sb.AutostopSec, sb.TTLSec, sb.ExpiresAt)
		}
		if sb.AutostopAt == nil || sb.AutostopAt.Sub(at) < 590*time.Second || sb.AutostopAt.Sub(at) > 610*time.Second {
			t.Errorf("PATCH: got autostop_at %v, want about 600 s after the call", sb.AutostopAt)
		}
		for {
			m := nextMsg(ctx, t, c)
			var ev gqlEvent
			if m.Type != "next" || json.Unmarshal(m.Payload, &ev) != nil || ev.Data.SandboxEvents == nil {
				t.Fatalf("got %s %s, want events", m.Type, m.Payload)
			}
			if e := *ev.Data.SandboxEvents; e.Type == "SANDBOX_UPDATED" {
				if e.Reason == nil || *e.Reason != "labels,autostop_sec,ttl_sec" || e.State != "RUNNING" {
					t.Errorf("got event %+v, want SANDBOX_UPDATED naming labels,autostop_sec,ttl_sec", e)
				}
				break
			}
		}
		send(ctx, t, c, wsMsg{ID: "1", Type: "complete"})
		_ = c.Close(websocket.StatusNormalClosure, "done")

		// The filters follow: env=prod no longer finds it, env=staging does.
		got, _ := pagesREST(t, e2e.HdrTenant1, url.Values{"label": {"env=staging"}})
		if !slices.Equal(got, []string{ids[0]}) {
			t.Errorf("env=staging after PATCH: got %v, want %s", got, ids[0])
		}
		got, _ = pagesREST(t, e2e.HdrTenant1, url.Values{"label": {"team=ml", "env=prod"}})
		if !slices.Equal(got, want[:2]) {
			t.Errorf("team=ml, env=prod after PATCH: got %v, want %v", got, want[:2])
		}

		// GraphQL's updateSandbox on another one; "labels": null through REST clears.
		g := s.GQL(t, `mutation($id: ID!) { updateSandbox(id: $id, input: {labels: [{key: "env", value: null}, {key: "ticket", value: "T-1"}], ttlSec: 10800}) { sandbox {
			id ttlSec expiresAt labels { key value } } } }`, map[string]any{"id": ids[1]}, e2e.HdrTenant1)
		var up gqlSandboxLabels
		g.OK(t, "updateSandbox.sandbox", &up)
		if want := map[string]string{"team": "ml", "ticket": "T-1"}; !maps.Equal(up.labelMap(), want) || up.TTLSec != 10800 || up.ExpiresAt == "" {
			t.Errorf("updateSandbox: got %+v, want labels %v and ttl 10800 with its expiry", up, want)
		}
		r = s.Curl(t, http.MethodPatch, e2e.Prefix+"/"+ids[1], []byte(`{"labels":null}`), e2e.HdrJSON, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
		var cleared labeledJSON
		r.Decode(t, &cleared)
		if len(cleared.Labels) != 0 || !strings.Contains(string(r.Body), `"labels":{}`) {
			t.Errorf(`"labels": null: got %s, want "labels":{}`, r.Body)
		}
	})

	e2e.Step(t, "update-refused", func(t *testing.T) {
		path := e2e.Prefix + "/" + ids[3]
		many := map[string]string{}
		for i := range 31 {
			many[fmt.Sprintf("k%02d", i)] = "v"
		}
		for _, tc := range []struct {
			name, body, code, mention string
			status                    int
		}{
			{"unknown-field", `{"state":"STOPPED"}`, "INVALID_ARGUMENT", "unknown field", 400},
			{"nothing", `{}`, "INVALID_ARGUMENT", "nothing to update", 400},
			{"not-an-object", `[1]`, "INVALID_ARGUMENT", "", 400},
			{"reserved", `{"labels":{"sandboxd.io/project":"p2"}}`, "INVALID_ARGUMENT", "reserved", 400},
			{"reserved-delete", `{"labels":{"kubernetes.io/x":null}}`, "INVALID_ARGUMENT", "reserved", 400},
			{"too-many-after-merge", e2e.MustJSON(t, map[string]any{"labels": many}), "INVALID_ARGUMENT", "at most 32", 400},
			{"autostop-zero", `{"autostop_sec":0}`, "INVALID_ARGUMENT", "autostop_sec", 400},
			{"ttl-over-max", `{"ttl_sec":99999999999}`, "INVALID_ARGUMENT", "ttl_sec", 400},
			{"ttl-in-the-past", `{"ttl_sec":1}`, "INVALID_ARGUMENT", "before now", 400},
			{"huge-body", `{"labels":{"a":"` + strings.Repeat("x", 9<<20) + `"}}`, "PAYLOAD_TOO_LARGE", "", 413},
		} {
			r := s.Curl(t, http.MethodPatch, path, []byte(tc.body), e2e.HdrJSON, e2e.HdrTenant1)
			if tc.mention != "" {
				r.WantError(t, tc.status, tc.code, tc.mention)
			} else {
				r.WantError(t, tc.status, tc.code)
			}
		}
		var sb labeledJSON
		r := s.Curl(t, http.MethodGet, path, nil, e2e.HdrTenant1)
		r.Decode(t, &sb)
		if !maps.Equal(sb.Labels, specs[3]) || sb.TTLSec != 86400 {
			t.Errorf("refused updates changed the sandbox: %+v", sb)
		}
		// Another tenant's sandbox, a missing one and a malformed id: 404, in both APIs.
		for _, p := range []string{path, e2e.Prefix + "/sbx_01J00000000000000000000000", e2e.Prefix + "/not-an-id"} {
			r := s.Curl(t, http.MethodPatch, p, []byte(`{"ttl_sec":100}`), e2e.HdrJSON, e2e.HdrTenant2)
			r.WantError(t, http.StatusNotFound, "NOT_FOUND")
		}
		g := s.GQL(t, `mutation($id: ID!) { updateSandbox(id: $id, input: {ttlSec: 100}) { sandbox { id } } }`, map[string]any{"id": ids[3]}, e2e.HdrTenant2)
		g.WantCode(t, 0, "NOT_FOUND")
	})

	e2e.Step(t, "autostop-honoured", func(t *testing.T) {
		// The listing is not activity (a GET would be): watch the sandbox there.
		r := s.Curl(t, http.MethodPatch, e2e.Prefix+"/"+ids[3], []byte(`{"autostop_sec":2}`), e2e.HdrJSON, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
		start := time.Now()
		e2e.Eventually(t, 60*time.Second, "the sandbox auto-stopped after its updated autostop_sec", func() (bool, string) {
			l := listREST(t, e2e.HdrTenant1, url.Values{"label": {"team=web"}})
			if len(l.Sandboxes) != 1 {
				return false, fmt.Sprintf("%+v", l)
			}
			sb := l.Sandboxes[0]
			return sb.State == "STOPPED", sb.State + " " + sb.StateReason
		})
		if el := time.Since(start); el < 1500*time.Millisecond {
			t.Errorf("stopped %v after the update, want about 2 s", el)
		}
		l := listREST(t, e2e.HdrTenant1, url.Values{"label": {"team=web"}})
		if sb := l.Sandboxes[0]; !strings.Contains(sb.StateReason, "after 2 s") || !maps.Equal(sb.Labels, specs[3]) {
			t.Errorf("got %+v, want auto-stopped after 2 s with its labels", sb)
		}
	})

	e2e.Step(t, "flush-and-restart", func(t *testing.T) {
		check := func(t *testing.T, s *e2e.Server, what string) {
			t.Helper()
			r := s.Curl(t, http.MethodGet, e2e.Prefix+"?"+url.Values{"label": {"team=ml", "env=prod"}}.Encode(), nil, e2e.HdrTenant1)
			r.Want(t, http.StatusOK)
			var l labeledList
			r.Decode(t, &l)
			var got []string
			for _, sb := range l.Sandboxes {
				got = append(got, sb.SandboxID)
			}
			if !slices.Equal(got, want[:2]) {
				t.Errorf("%s: team=ml, env=prod: got %v, want %v", what, got, want[:2])
			}
			r = s.Curl(t, http.MethodGet, e2e.Prefix+"/"+ids[0], nil, e2e.HdrTenant1)
			var sb labeledJSON
			r.Decode(t, &sb)
			if want := map[string]string{"env": "staging", "owner": "alice"}; !maps.Equal(sb.Labels, want) || sb.TTLSec != 7200 || sb.AutostopSec != 600 {
				t.Errorf("%s: got %+v, want the updated labels, ttl and autostop", what, sb)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rs.Client.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		check(t, s, "after FLUSHALL")
		s.Stop(t)
		if err := rs.Client.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		s2 := e2e.StartServer(t, opts)
		for _, id := range ids {
			s2.Track(id, e2e.HdrTenant1)
		}
		l := listREST2(t, s2, e2e.HdrTenant2)
		for _, id := range l {
			s2.Track(id, e2e.HdrTenant2)
		}
		check(t, s2, "after a restart on a flushed Redis")
		// A destroyed sandbox is gone for an update too.
		s2.Curl(t, http.MethodDelete, e2e.Prefix+"/"+ids[1], nil, e2e.HdrTenant1).Want(t, http.StatusOK)
		s2.Curl(t, http.MethodPatch, e2e.Prefix+"/"+ids[1], []byte(`{"ttl_sec":100}`), e2e.HdrJSON, e2e.HdrTenant1).
			WantError(t, http.StatusNotFound, "NOT_FOUND")
	})
}

// listREST2 lists the ids of every sandbox of the key's project on s.
func listREST2(t *testing.T, s *e2e.Server, hdr string) []string {
	t.Helper()
	var ids []string
	for _, sb := range s.ListAll(t, hdr).Sandboxes {
		ids = append(ids, sb.SandboxID)
	}
	return ids
}

// TestKubeLabels: on the kube runtime a sandbox's labels are on its PVC and pod (beside the
// driver's own), the record's copy in the PVC's annotations; a PATCH mirrors the change onto
// both, a started-again pod carries them, and a control-plane restart on a flushed Redis
// filters by them from the cluster alone.
func TestKubeLabels(t *testing.T) {
	c := kubetest.Require(t)
	_, kubeconfig := c.Gateway(t)
	cs := c.Clientset(t)
	rs := redistest.Start(t)
	opts := kubeServerOptions(t, kubeconfig, rs.URL, e2e.NewStateDir(t))
	s := e2e.StartServer(t, opts)
	ctx := func(t *testing.T) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		t.Cleanup(cancel)
		return ctx
	}
	// objectLabels are the labels of the sandbox's pod (nil when it has none) and PVC.
	objectLabels := func(t *testing.T, name string) (pod, pvc map[string]string) {
		t.Helper()
		p, err := cs.CoreV1().Pods(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{})
		if err == nil {
			pod = p.Labels
		} else if !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		v, err := cs.CoreV1().PersistentVolumeClaims(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v.Annotations[kube.AnnLabels] == "" {
			t.Errorf("the PVC has no %s annotation: %v", kube.AnnLabels, v.Annotations)
		}
		return pod, v.Labels
	}
	has := func(got, want map[string]string, gone ...string) bool {
		for k, v := range want {
			if g, ok := got[k]; !ok || g != v {
				return false
			}
		}
		for _, k := range gone {
			if _, ok := got[k]; ok {
				return false
			}
		}
		return true
	}

	labels := map[string]string{"team": "ml", "example.com/tier": "gold"}
	sb := s.Create(t, e2e.MustJSON(t, map[string]any{"profile": "sandboxes-default", "labels": labels}), e2e.HdrDev)
	id := sb.SandboxID
	name, _ := kube.ObjectName(id)

	e2e.Step(t, "labels-on-objects", func(t *testing.T) {
		pod, pvc := objectLabels(t, name)
		for what, l := range map[string]map[string]string{"pod": pod, "PVC": pvc} {
			if !has(l, labels) || l[kube.LabelSandboxID] != id || l[kube.LabelTenant] != "dev" {
				t.Errorf("%s labels %v, want %v beside the driver's own", what, l, labels)
			}
		}
	})

	e2e.Step(t, "patch-mirrors", func(t *testing.T) {
		r := s.Curl(t, http.MethodPatch, e2e.Prefix+"/"+id, []byte(`{"labels":{"team":null,"owner":"alice"}}`), e2e.HdrJSON, e2e.HdrDev)
		r.Want(t, http.StatusOK)
		want := map[string]string{"example.com/tier": "gold", "owner": "alice"}
		pod, pvc := objectLabels(t, name)
		if !has(pvc, want, "team") || pvc[kube.LabelSandboxID] != id {
			t.Errorf("PVC labels %v, want %v without team", pvc, want)
		}
		if !has(pod, want, "team") || pod[kube.LabelSandboxID] != id {
			t.Errorf("pod labels %v, want %v without team", pod, want)
		}
		l := s.Curl(t, http.MethodGet, e2e.Prefix+"?label=owner=alice&label=example.com/tier=gold", nil, e2e.HdrDev)
		l.Want(t, http.StatusOK)
		var page labeledList
		l.Decode(t, &page)
		if len(page.Sandboxes) != 1 || page.Sandboxes[0].SandboxID != id {
			t.Errorf("the filter: got %+v, want %s", page.Sandboxes, id)
		}
	})

	e2e.Step(t, "new-pod-carries-them", func(t *testing.T) {
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/stop", nil, e2e.HdrDev).Want(t, http.StatusOK)
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/start", nil, e2e.HdrDev).Want(t, http.StatusOK)
		pod, _ := objectLabels(t, name)
		if !has(pod, map[string]string{"example.com/tier": "gold", "owner": "alice"}, "team") {
			t.Errorf("the new pod's labels %v, want the sandbox's", pod)
		}
	})

	s.Stop(t)
	if err := rs.Client.FlushAll(ctx(t)).Err(); err != nil {
		t.Fatal(err)
	}
	s = e2e.StartServer(t, opts)
	s.Track(id, e2e.HdrDev)

	e2e.Step(t, "restart-after-flushall", func(t *testing.T) {
		l := s.Curl(t, http.MethodGet, e2e.Prefix+"?label=owner=alice", nil, e2e.HdrDev)
		l.Want(t, http.StatusOK)
		var page labeledList
		l.Decode(t, &page)
		if len(page.Sandboxes) != 1 || page.Sandboxes[0].SandboxID != id || page.Sandboxes[0].Labels["example.com/tier"] != "gold" {
			t.Errorf("after a restart on a flushed Redis: got %+v, want %s with its labels", page.Sandboxes, id)
		}
		s.Curl(t, http.MethodPatch, e2e.Prefix+"/"+id, []byte(`{"ttl_sec":100}`), e2e.HdrJSON, e2e.HdrTenant1).WantError(t, http.StatusNotFound, "NOT_FOUND")
	})
}
