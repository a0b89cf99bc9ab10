package resolvers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
)

// The public edge as a hostile client meets it: requests that try to pass the gate without a
// key, operations priced over their budget, and WebSocket protocol abuse.

func TestGateRefusesKeylessNonWebsocketUpgrades(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	body := `{"query":"{__schema{types{name}}}"}`
	for _, tt := range []struct {
		name    string
		method  string
		headers map[string]string
	}{
		{"post-upgrade-sse", http.MethodPost, map[string]string{"Upgrade": "x", "Accept": "text/event-stream", "Content-Type": "application/json"}},
		{"post-upgrade-websocket", http.MethodPost, map[string]string{"Upgrade": "websocket", "Connection": "Upgrade", "Content-Type": "application/json"}},
		{"post-upgrade-json", http.MethodPost, map[string]string{"Upgrade": "h2c", "Content-Type": "application/json"}},
		{"get-upgrade-without-connection", http.MethodGet, map[string]string{"Upgrade": "websocket"}},
		{"head", http.MethodHead, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			url := e.srv.URL + "/graphql"
			var rd io.Reader = strings.NewReader(body)
			if tt.method != http.MethodPost {
				url += "?query=%7B__schema%7Btypes%7Bname%7D%7D%7D"
				rd = nil
			}
			req, _ := http.NewRequest(tt.method, url, rd)
			for k, v := range tt.headers {
				req.Header.Set(k, v)
			}
			resp, err := e.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("got %d %s, want 401", resp.StatusCode, raw)
			}
			if bytes.Contains(raw, []byte("__schema")) || bytes.Contains(raw, []byte("Sandbox")) {
				t.Errorf("the answer tells of the schema: %s", raw)
			}
		})
	}
	if calls := e.fake.Called(); len(calls) != 0 {
		t.Errorf("got service calls %v, want none", calls)
	}
}

func TestGateBoundsEveryBody(t *testing.T) {
	e := newEnv(t, HandlerOptions{MaxBodyBytes: 1 << 10})
	big := `{"query":"{profiles{name}}","x":"` + strings.Repeat("A", 4<<10) + `"}`
	for _, accept := range []string{"application/json", "text/event-stream"} {
		for _, upgrade := range []string{"", "x"} {
			t.Run(accept+"/upgrade="+upgrade, func(t *testing.T) {
				req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/graphql", strings.NewReader(big))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", accept)
				req.Header.Set(auth.HeaderAPIKey, apitest.UserKey)
				if upgrade != "" {
					req.Header.Set("Upgrade", upgrade)
				}
				resp, err := e.srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusRequestEntityTooLarge || !bytes.Contains(raw, []byte("PAYLOAD_TOO_LARGE")) {
					t.Errorf("got %d %s, want 413 PAYLOAD_TOO_LARGE", resp.StatusCode, raw)
				}
				if bytes.Contains(raw, []byte("AAAA")) {
					t.Errorf("the answer echoes the body")
				}
			})
		}
	}
}

func TestMalformedBodyIsNotEchoed(t *testing.T) {
	e := newEnv(t, HandlerOptions{MaxBodyBytes: 1 << 20})
	bad := `{"query": "{ profiles ` + strings.Repeat("Z", 100<<10)
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/graphql", strings.NewReader(bad))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(auth.HeaderAPIKey, apitest.UserKey)
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if len(raw) > 1024 || bytes.Contains(raw, []byte("ZZZZ")) {
		t.Errorf("got a %d-byte answer that echoes the body: %.200s", len(raw), raw)
	}
	// A parse error inside a valid JSON body quotes at most a short token.
	r := e.post(t, apitest.UserKey, `{ profiles { name } "`+strings.Repeat("Q", 50<<10)+`" }`, nil)
	for _, er := range r.Errors {
		if len(er.Message) > maxErrorMessage+3 {
			t.Errorf("got a %d-byte error message", len(er.Message))
		}
	}
}

func TestIntrospectionCanBeTurnedOff(t *testing.T) {
	e := newEnv(t, HandlerOptions{DisableIntrospection: true})
	r := e.post(t, apitest.UserKey, `{__schema{types{name}}}`, nil)
	if len(r.Errors) == 0 || r.Data["__schema"] != nil && string(r.Data["__schema"]) != "null" {
		t.Fatalf("got %+v, want introspection refused", r)
	}
	noErrors(t, e.post(t, apitest.UserKey, `{profiles{name}}`, nil))
}

func TestCostModel(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	aliases := func(n int, field string) string {
		var b strings.Builder
		b.WriteString("{")
		for i := range n {
			fmt.Fprintf(&b, "a%d: %s ", i, field)
		}
		return b.String() + "}"
	}
	tests := []struct {
		name     string
		query    string
		wantCode string
	}{
		{"one-file", `{readFile(sandboxId:"` + apitest.SandboxRunning + `", path:"a"){contentBase64}}`, ""},
		{"two-files", aliases(2, `readFile(sandboxId:"`+apitest.SandboxRunning+`", path:"a"){contentBase64}`), "COST_EXCEEDED"},
		{"many-small-files", aliases(100, `readFile(sandboxId:"`+apitest.SandboxRunning+`", path:"a", maxBytes: 65536){size}`), ""},
		{"alias-storm", aliases(200, `readFile(sandboxId:"`+apitest.SandboxRunning+`", path:"a"){contentBase64}`), "COST_EXCEEDED"},
		{"big-page", `{sandboxes(first: 500){edges{node{id state profileName tenantId projectId createdAt resources{milliCpu memoryBytes diskBytes}}}}}`, ""},
		{"big-page-many-aliases", aliases(3, `sandboxes(first: 500){edges{node{id state profileName tenantId projectId createdAt}}}`), "COST_EXCEEDED"},
		{"exec-output-fields", aliases(20, `exec(id:"exec_x"){stdout stderr stdoutBase64 stderrBase64}`), "COST_EXCEEDED"},
		// The exec mutation's output sits inside its payload and is priced there all the same:
		// 10 mutations (the most one operation may hold) of 4 output fields reserve 40 MiB.
		{"exec-payload-output-fields", "mutation " + aliases(10, `exec(sandboxId:"`+apitest.SandboxRunning+`", input:{command:["true"]}){exec{stdout stderr stdoutBase64 stderrBase64}}`), "COST_EXCEEDED"},
		{"exec-payload-status-only", "mutation " + aliases(10, `exec(sandboxId:"`+apitest.SandboxRunning+`", input:{command:["true"]}){exec{execId exitCode}}`), ""},
		// Each field that calls a guest init or scans an index of execs costs backendPoints
		// more: a few hundred are fine, a few thousand aliases are not one cheap operation.
		{"some-stats", aliases(100, `stat(sandboxId:"`+apitest.SandboxRunning+`", path:"a"){size}`), ""},
		{"stat-storm", aliases(500, `stat(sandboxId:"`+apitest.SandboxRunning+`", path:"a"){size}`), "COST_EXCEEDED"},
		{"execs-storm", aliases(500, `execs(sandboxId:"`+apitest.SandboxRunning+`", first: 1){__typename}`), "COST_EXCEEDED"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(e.fake.Called())
			r := e.post(t, apitest.UserKey, tt.query, nil)
			if tt.wantCode == "" {
				// Priced within budget and run: a field may still fail on its own (the fake's
				// file), never the whole operation.
				for i := range r.Errors {
					switch r.code(i) {
					case "COST_EXCEEDED", "GRAPHQL_VALIDATION_FAILED", "GRAPHQL_PARSE_FAILED":
						t.Fatalf("got %+v, want it priced within budget and run", r.Errors)
					}
				}
				if len(e.fake.Called()) == before {
					t.Fatalf("nothing ran: %+v", r)
				}
				return
			}
			if r.code(0) != tt.wantCode {
				t.Fatalf("got %+v, want %s", r.Errors, tt.wantCode)
			}
			if _, ok := r.Errors[0].Extensions["cost"].(map[string]any); !ok {
				t.Errorf("the refusal carries no cost: %+v", r.Errors[0].Extensions)
			}
			if calls := e.fake.Called(); len(calls) != before {
				t.Errorf("got service calls %v, want none", calls[before:])
			}
		})
	}
}

func TestCostIsReported(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/graphql",
		strings.NewReader(`{"query":"{ sandboxes(first: 10) { edges { node { id } } } }"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(auth.HeaderAPIKey, apitest.UserKey)
	var out struct {
		Extensions struct {
			Cost struct {
				Points      int64 `json:"points"`
				PointsLimit int64 `json:"pointsLimit"`
				Bytes       int64 `json:"bytes"`
			} `json:"cost"`
		} `json:"extensions"`
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	// sandboxes 1 + 10 × (edges 1 + node 1 + id 1) = 31.
	if out.Extensions.Cost.Points != 31 || out.Extensions.Cost.PointsLimit != DefaultCostLimit {
		t.Errorf("got cost %+v in %s, want 31 points of %d", out.Extensions.Cost, raw, DefaultCostLimit)
	}
}

// TestConnectionsPricedByFirst: snapshots and agentRuns multiply their selection by first
// (its default when omitted), as sandboxes and execs do; only the items (edges, nodes), not the
// page's own fields (pageInfo, path).
func TestConnectionsPricedByFirst(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	run := `sandboxId: "` + apitest.SandboxRunning + `"`
	for _, tc := range []struct {
		name, query string
		want        float64
	}{
		// 1 + first × (edges 1 + node 1 + id 1)
		{"agent-runs-first", `{ agentRuns(` + run + `, first: 3) { edges { node { id } } } }`, 1 + 3*3},
		{"agent-runs-default", `{ agentRuns(` + run + `) { edges { node { id } } } }`, 1 + 50*3},
		// 1 + first × (nodes 1 + id 1)
		{"snapshots-first", `{ snapshots(first: 7) { nodes { id } } }`, 1 + 7*2},
		{"snapshots-default", `{ snapshots { nodes { id } } }`, 1 + 50*2},
		// A page's pageInfo is resolved once, not once per item: 1 + 10 × (edges, node, id) +
		// pageInfo 1 + its 2 fields; also through a fragment.
		{"page-info-once", `{ sandboxes(first: 10) { edges { node { id } } pageInfo { hasNextPage endCursor } } }`, 1 + 10*3 + 3},
		{"page-info-fragment", `{ snapshots(first: 10) { ...page } } fragment page on SnapshotConnection { nodes { id } pageInfo { endCursor } }`, 1 + 10*2 + 2},
		{"files-path-once", `{ listFiles(` + run + `, first: 100) { path nodes { name } } }`, 1 + backendPoints + 1 + 100*2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.post(t, apitest.UserKey, tc.query, nil)
			noErrors(t, r)
			var cost map[string]float64
			if err := json.Unmarshal(r.Extensions["cost"], &cost); err != nil || cost["points"] != tc.want {
				t.Errorf("got cost %v, want %v points", cost, tc.want)
			}
		})
	}
	// 31 × (1 + 100 × 5) points: over the default 10 000.
	storm := `{ `
	for i := range 31 {
		storm += fmt.Sprintf(`b%d: agentRuns(%s, first: 100) { edges { node { id status agentId } } } `, i, run)
	}
	if r := e.post(t, apitest.UserKey, storm+`}`, nil); r.code(0) != "COST_EXCEEDED" {
		t.Errorf("31 aliased pages of 100 runs: got %+v, want COST_EXCEEDED", r.Errors)
	}
}

func TestMutationFieldCap(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	var b strings.Builder
	b.WriteString("mutation {")
	for i := range 100 {
		fmt.Fprintf(&b, `e%d: exec(sandboxId:"%s", input:{command:["true"]}, wait:false){ exec {execId} } `, i, apitest.SandboxRunning)
	}
	b.WriteString("}")
	r := e.post(t, apitest.UserKey, b.String(), nil)
	if r.code(0) != "COST_EXCEEDED" || !strings.Contains(r.Errors[0].Message, "mutation fields") {
		t.Fatalf("got %+v, want COST_EXCEEDED for mutation fields", r.Errors)
	}
	if calls := e.fake.Called(); len(calls) != 0 {
		t.Errorf("got service calls %v, want none", calls)
	}
}

func TestRateLimitHook(t *testing.T) {
	var n atomic.Int64
	limit := func(_ context.Context, p auth.Principal) error {
		if n.Add(1) > 3 {
			return apierror.New(apierror.RateLimited, "slow down").WithRetryAfter(2 * time.Second)
		}
		return nil
	}
	e := newEnv(t, HandlerOptions{RateLimit: limit})
	for range 3 {
		noErrors(t, e.post(t, apitest.UserKey, `{profiles{name}}`, nil))
	}
	r := e.post(t, apitest.UserKey, `{profiles{name}}`, nil)
	if r.Status != http.StatusTooManyRequests || r.code(0) != "RATE_LIMITED" || r.Errors[0].Extensions["retryAfter"] != float64(2) {
		t.Fatalf("got %d %+v, want 429 RATE_LIMITED retryAfter 2", r.Status, r.Errors)
	}

	// Over a WebSocket, each operation is charged when it is opened.
	n.Store(0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := dialAuthed(ctx, t, e)
	for i := range 3 {
		id := fmt.Sprint(i)
		send(ctx, t, c, wsMsg{ID: id, Type: "subscribe", Payload: mustJSON(map[string]any{"query": `{profiles{name}}`})})
		m := next(ctx, t, c)
		if i < 2 && m.Type != "next" {
			t.Fatalf("op %d: got %+v, want next", i, m)
		}
		if i == 2 && (m.Type != "next" || !strings.Contains(string(m.Payload), "RATE_LIMITED")) {
			t.Fatalf("op %d: got %+v %s, want a RATE_LIMITED error", i, m, m.Payload)
		}
		for m.Type != "complete" && m.Type != "error" {
			m = next(ctx, t, c)
		}
	}
}

// dialAuthed opens a graphql-transport-ws connection and authenticates it with apitest.UserKey.
func dialAuthed(ctx context.Context, t *testing.T, e *env) *websocket.Conn {
	t.Helper()
	c := dialWS(ctx, t, e, "graphql-transport-ws", nil)
	send(ctx, t, c, wsMsg{Type: "connection_init", Payload: mustJSON(map[string]any{"X-Api-Key": apitest.UserKey})})
	if m := next(ctx, t, c); m.Type != "connection_ack" {
		t.Fatalf("got %+v, want connection_ack", m)
	}
	return c
}

// closeOf reads until the socket closes and returns its close code and reason.
func closeOf(ctx context.Context, t *testing.T, c *websocket.Conn) (websocket.StatusCode, string) {
	t.Helper()
	for {
		var m wsMsg
		err := wsjson.Read(ctx, c, &m)
		if err == nil {
			continue
		}
		var ce websocket.CloseError
		if !errors.As(err, &ce) {
			t.Fatalf("got %v, want the socket closed with a code", err)
		}
		return ce.Code, ce.Reason
	}
}

func TestWebsocketProtocolCloseCodes(t *testing.T) {
	init := wsMsg{Type: "connection_init", Payload: mustJSON(map[string]any{"X-Api-Key": apitest.UserKey})}
	sub := func(id string) wsMsg { return wsMsg{ID: id, Type: "subscribe", Payload: subscribePayload(nil)} }
	tests := []struct {
		name     string
		send     []wsMsg
		wantCode websocket.StatusCode
	}{
		{"init-timeout", nil, 4408},
		{"second-init", []wsMsg{init, init}, 4429},
		{"subscribe-before-init", []wsMsg{sub("1")}, 4401},
		{"duplicate-id", []wsMsg{init, sub("1"), sub("1")}, 4409},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, HandlerOptions{InitTimeout: 300 * time.Millisecond})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c := dialWS(ctx, t, e, "graphql-transport-ws", nil)
			for _, m := range tt.send {
				send(ctx, t, c, m)
			}
			if code, reason := closeOf(ctx, t, c); code != tt.wantCode {
				t.Errorf("got close %d %q, want %d", code, reason, tt.wantCode)
			}
		})
	}
}

func TestWebsocketOperationsPerConnection(t *testing.T) {
	e := newEnv(t, HandlerOptions{MaxOperationsPerConnection: 3})
	e.fake.SandboxEvents = testEvents() // and then the streams stay open
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := dialAuthed(ctx, t, e)
	for i := range 3 {
		send(ctx, t, c, wsMsg{ID: fmt.Sprint(i), Type: "subscribe", Payload: subscribePayload(nil)})
	}
	send(ctx, t, c, wsMsg{ID: "over", Type: "subscribe", Payload: subscribePayload(nil)})
	for {
		m := next(ctx, t, c)
		if m.ID != "over" {
			continue
		}
		if m.Type != "error" || !strings.Contains(string(m.Payload), "LIMIT_EXCEEDED") {
			t.Fatalf("got %+v %s, want an error LIMIT_EXCEEDED", m, m.Payload)
		}
		break
	}
	// Completing one frees its place; the id of a refused operation may be used again.
	send(ctx, t, c, wsMsg{ID: "0", Type: "complete"})
	send(ctx, t, c, wsMsg{ID: "over", Type: "subscribe", Payload: subscribePayload(nil)})
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		m := next(ctx, t, c)
		if m.ID == "over" {
			if m.Type != "next" {
				t.Fatalf("got %+v %s, want the subscription served", m, m.Payload)
			}
			return
		}
	}
	t.Fatal("the subscription was not served after a place was freed")
}
