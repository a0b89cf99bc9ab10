package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"

	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

// The public edge, tried as a hostile client would against the built server: paths through the
// gate without a key, unpriced queries, one tenant starving the others, a rate limit that one
// replica cannot see, and browsers from other origins.

// rssBytes is the resident set of process pid.
func rssBytes(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// rawPost sends a POST /graphql with exactly these headers and body, and reads at most 1 MiB of
// the answer.
func rawPost(t *testing.T, s *e2e.Server, body io.Reader, headers map[string]string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.URL+"/graphql", body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		// The server may answer a bounded body early and close while the client still sends.
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, raw
}

func TestEdgeNoKeylessPath(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	pid := s.PID()

	e2e.Step(t, "keyless-upgrade-sse-is-401", func(t *testing.T) {
		for _, upgrade := range []string{"x", "websocket", "h2c"} {
			status, raw := rawPost(t, s, strings.NewReader(`{"query":"{__schema{types{name}}}"}`), map[string]string{
				"Upgrade": upgrade, "Accept": "text/event-stream", "Content-Type": "application/json"})
			if status != http.StatusUnauthorized || bytes.Contains(raw, []byte("__Schema")) || bytes.Contains(raw, []byte("Sandbox")) {
				t.Errorf("Upgrade: %s: got %d %.300s, want 401 and no schema", upgrade, status, raw)
			}
		}
	})

	e2e.Step(t, "bodies-are-bounded-before-parsing", func(t *testing.T) {
		before := rssBytes(t, pid)
		big := bytes.Repeat([]byte("A"), 50<<20)
		var wg sync.WaitGroup
		statuses := make([]int, 10)
		for i := range statuses {
			wg.Go(func() {
				body := io.MultiReader(strings.NewReader(`{"query":"{profiles{name}}","x":"`), bytes.NewReader(big), strings.NewReader(`"}`))
				statuses[i], _ = rawPost(t, s, body, map[string]string{"Upgrade": "x", "Accept": "text/event-stream",
					"Content-Type": "application/json", "X-Api-Key": e2e.KeyDev})
			})
		}
		wg.Wait()
		after := rssBytes(t, pid)
		t.Logf("10 parallel 50 MB bodies (SSE, Upgrade: x, with a key): statuses %v; server RSS %d MiB → %d MiB (+%d MiB)",
			statuses, before>>20, after>>20, (after-before)>>20)
		for _, st := range statuses {
			if st != http.StatusRequestEntityTooLarge && st != 0 {
				t.Errorf("got status %d, want 413 (or the connection cut while sending)", st)
			}
		}
		// Buffering the bodies would take 500 MB (it took 2 GB before the gate bounded them);
		// the bound leaves room for the race detector's overhead and a busy machine's GC.
		if after-before > 200<<20 {
			t.Errorf("server RSS grew by %d MiB for bodies it must refuse after 1 MiB", (after-before)>>20)
		}
	})

	e2e.Step(t, "errors-never-echo-the-input", func(t *testing.T) {
		bad := append([]byte(`{"query": "{ profiles `), bytes.Repeat([]byte("Z"), 900<<10)...)
		status, raw := rawPost(t, s, bytes.NewReader(bad), map[string]string{"Content-Type": "application/json", "X-Api-Key": e2e.KeyDev})
		if len(raw) > 2048 || bytes.Contains(raw, []byte("ZZZZZZZZ")) {
			t.Errorf("got %d with a %d-byte answer echoing the body: %.200s", status, len(raw), raw)
		}
		q := `{ profiles { name } "` + strings.Repeat("Q", 500<<10) + `" }`
		status, raw = rawPost(t, s, strings.NewReader(e2e.MustJSON(t, map[string]any{"query": q})),
			map[string]string{"Content-Type": "application/json", "X-Api-Key": e2e.KeyDev})
		if len(raw) > 2048 {
			t.Errorf("a parse error answered %d with %d bytes: %.200s", status, len(raw), raw)
		}
	})

	e2e.Step(t, "introspection-needs-a-key", func(t *testing.T) {
		status, raw := rawPost(t, s, strings.NewReader(`{"query":"{__schema{types{name}}}"}`), map[string]string{"Content-Type": "application/json"})
		if status != http.StatusUnauthorized || bytes.Contains(raw, []byte("Sandbox")) {
			t.Errorf("got %d %.300s, want 401", status, raw)
		}
		g := s.GQL(t, `{__schema{queryType{name}}}`, nil, e2e.HdrDev)
		if len(g.Errors) > 0 {
			t.Errorf("introspection with a key: %s", g)
		}
	})

	e2e.Step(t, "introspection-off-by-config", func(t *testing.T) {
		off := e2e.StartServer(t, e2e.ServerOptions{Extra: map[string]any{"graphql": map[string]any{"introspection": false}}})
		g := off.GQL(t, `{__schema{types{name}}}`, nil, e2e.HdrDev)
		if len(g.Errors) == 0 || strings.Contains(g.Resp.String(), `"types"`) {
			t.Errorf("got %s, want introspection refused", g)
		}
	})
}

func TestEdgeAliasStorms(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	pid := s.PID()
	sb := s.Create(t, `{}`, e2e.HdrDev)
	s.Run(t, sb.SandboxID, []string{"bash", "-c", "head -c 5242880 /dev/urandom > /workspace/big.bin"}, e2e.HdrDev)

	aliases := func(n int, field string) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "a%d: %s ", i, field)
		}
		return b.String()
	}
	e2e.Step(t, "readFile-storm-refused-before-it-runs", func(t *testing.T) {
		before := rssBytes(t, pid)
		start := time.Now()
		q := "{" + aliases(200, `readFile(sandboxId: "`+sb.SandboxID+`", path: "big.bin") { contentBase64 }`) + "}"
		g := s.GQL(t, q, nil, e2e.HdrDev)
		took := time.Since(start)
		after := rssBytes(t, pid)
		t.Logf("200 aliased readFile of a 5 MiB file: %d in %v; server RSS %d MiB → %d MiB (+%d MiB); answer %d bytes",
			g.Resp.Status, took.Round(time.Millisecond), before>>20, after>>20, (after-before)>>20, len(g.Resp.Body))
		if len(g.Errors) == 0 || g.Errors[0].Code() != "COST_EXCEEDED" {
			t.Fatalf("got %s, want COST_EXCEEDED", g)
		}
		// Running it would answer 1.3 GB (and took 6.4 GiB of RSS before it was priced).
		if len(g.Resp.Body) > 4096 || after-before > 200<<20 {
			t.Errorf("the refused storm still cost: a %d-byte answer, +%d MiB RSS", len(g.Resp.Body), (after-before)>>20)
		}
	})

	e2e.Step(t, "small-reads-fit", func(t *testing.T) {
		q := "{" + aliases(50, `readFile(sandboxId: "`+sb.SandboxID+`", path: "big.bin", maxBytes: 65536) { size }`) + "}"
		g := s.GQL(t, q, nil, e2e.HdrDev)
		// Each is refused on its own (the file is larger than maxBytes); none is priced out.
		if len(g.Errors) == 0 || g.Errors[0].Code() != "PAYLOAD_TOO_LARGE" {
			t.Fatalf("got %s, want each read PAYLOAD_TOO_LARGE", g)
		}
		var one struct {
			ReadFile struct{ Size int64 }
		}
		g = s.GQL(t, `query($s: ID!) { readFile(sandboxId: $s, path: "big.bin", maxBytes: 6000000) { size } }`,
			map[string]any{"s": sb.SandboxID}, e2e.HdrDev)
		g.OK(t, "readFile", &one.ReadFile)
		if one.ReadFile.Size != 5<<20 {
			t.Errorf("got size %d, want %d", one.ReadFile.Size, 5<<20)
		}
		var cost struct {
			Extensions struct {
				Cost map[string]int64 `json:"cost"`
			} `json:"extensions"`
		}
		if err := json.Unmarshal(g.Resp.Body, &cost); err != nil || cost.Extensions.Cost["bytes"] != 6000000 {
			t.Errorf("got extensions %s, want cost.bytes 6000000", g.Resp.Body)
		}
	})

	e2e.Step(t, "mutation-storm-refused", func(t *testing.T) {
		q := "mutation {" + aliases(100, `exec(sandboxId: "`+sb.SandboxID+`", input: {command: ["sleep", "60"]}, wait: false) { exec { execId } }`) + "}"
		g := s.GQL(t, q, nil, e2e.HdrDev)
		if len(g.Errors) == 0 || g.Errors[0].Code() != "COST_EXCEEDED" {
			t.Fatalf("got %s, want COST_EXCEEDED", g)
		}
		out := s.Run(t, sb.SandboxID, []string{"bash", "-c", "ps -eo args | grep -c '^sleep 60' || true"}, e2e.HdrDev)
		if strings.TrimSpace(out) != "0" {
			t.Errorf("got %s sleep commands running, want none started", strings.TrimSpace(out))
		}
	})
}

// wsClient is a GraphQL WebSocket whose messages a goroutine reads into a channel, so that a
// test can wait for one with a timeout (coder/websocket closes a connection whose read context
// ends).
type wsClient struct {
	c    *websocket.Conn
	msgs chan wsMsg
	err  chan error // the read error that ended the connection
}

// wsOpen dials the GraphQL WebSocket and authenticates with key.
func wsOpen(ctx context.Context, t *testing.T, s *e2e.Server, key string) *wsClient {
	t.Helper()
	w := &wsClient{c: dialGraphQL(ctx, t, s), msgs: make(chan wsMsg, 64), err: make(chan error, 1)}
	go func() {
		for {
			var m wsMsg
			if err := wsjson.Read(ctx, w.c, &m); err != nil {
				w.err <- err
				close(w.msgs)
				return
			}
			if m.Type == "ping" {
				_ = wsjson.Write(ctx, w.c, wsMsg{Type: "pong"})
				continue
			}
			if m.Type != "pong" {
				w.msgs <- m
			}
		}
	}()
	send(ctx, t, w.c, wsMsg{Type: "connection_init", Payload: rawJSON(t, map[string]any{"X-Api-Key": key})})
	if m := w.next(t, 10*time.Second); m.Type != "connection_ack" {
		t.Fatalf("got %+v, want connection_ack", m)
	}
	return w
}

// next is the next message within wait, or a zero message.
func (w *wsClient) next(t *testing.T, wait time.Duration) wsMsg {
	t.Helper()
	select {
	case m, ok := <-w.msgs:
		if !ok {
			t.Fatalf("the WebSocket ended: %v", <-w.err)
		}
		return m
	case <-time.After(wait):
		return wsMsg{}
	}
}

// subscribeEvents subscribes id to sandboxEvents and returns the first message for it within
// wait, or a zero message when none came (the subscription is open and quiet).
func (w *wsClient) subscribeEvents(ctx context.Context, t *testing.T, id string, wait time.Duration) wsMsg {
	t.Helper()
	send(ctx, t, w.c, wsMsg{ID: id, Type: "subscribe", Payload: rawJSON(t, map[string]any{
		"query": `subscription { sandboxEvents { cursor type } }`})})
	deadline := time.Now().Add(wait)
	for {
		m := w.next(t, time.Until(deadline))
		if m.Type == "" || m.ID == id {
			return m
		}
	}
}

func TestEdgeFairShares(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{Extra: map[string]any{
		"max_streams_per_project": 4,
		"graphql":                 map[string]any{"max_operations_per_connection": 3},
		"execs":                   map[string]any{"max_running_per_sandbox": 2},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sbA := s.Create(t, `{}`, e2e.HdrTenant1)
	sbB := s.Create(t, `{}`, e2e.HdrTenant2)
	exA := s.Exec(t, sbA.SandboxID, `{"command":["true"]}`, e2e.HdrTenant1)

	e2e.Step(t, "tenant-A-fills-its-share", func(t *testing.T) {
		a1 := wsOpen(ctx, t, s, e2e.KeyTenant1)
		for i := range 3 {
			if m := a1.subscribeEvents(ctx, t, fmt.Sprint(i), 300*time.Millisecond); m.Type != "" {
				t.Fatalf("subscription %d: got %+v %s, want it open", i, m, m.Payload)
			}
		}
		// The connection's own cap.
		m := a1.subscribeEvents(ctx, t, "3", 5*time.Second)
		if m.Type != "error" || !strings.Contains(string(m.Payload), "LIMIT_EXCEEDED") || !strings.Contains(string(m.Payload), "operations_per_connection") {
			t.Fatalf("4th operation on one connection: got %+v %s, want an error LIMIT_EXCEEDED", m, m.Payload)
		}
		// The project's cap, across connections.
		a2 := wsOpen(ctx, t, s, e2e.KeyTenant1)
		if m := a2.subscribeEvents(ctx, t, "a", 300*time.Millisecond); m.Type != "" {
			t.Fatalf("4th stream of the project: got %+v %s, want it open", m, m.Payload)
		}
		m = a2.subscribeEvents(ctx, t, "b", 5*time.Second)
		if !strings.Contains(string(m.Payload), "LIMIT_EXCEEDED") || !strings.Contains(string(m.Payload), "streams_per_project") {
			t.Fatalf("5th stream of the project: got %+v %s, want LIMIT_EXCEEDED", m, m.Payload)
		}
		// REST streams count against the same share; other calls go on.
		r := s.Curl(t, http.MethodGet, e2e.Prefix+"/"+sbA.SandboxID+"/execs/"+exA.ExecID+"/output", nil, e2e.HdrTenant1)
		r.WantError(t, http.StatusTooManyRequests, "LIMIT_EXCEEDED")
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+sbA.SandboxID, nil, e2e.HdrTenant1).Want(t, http.StatusOK)
	})

	e2e.Step(t, "tenant-B-is-unaffected", func(t *testing.T) {
		b := wsOpen(ctx, t, s, e2e.KeyTenant2)
		if m := b.subscribeEvents(ctx, t, "b1", 300*time.Millisecond); m.Type != "" {
			t.Fatalf("tenant B's subscription: got %+v %s, want it open", m, m.Payload)
		}
		ex := detach(t, s, sbB.SandboxID, `{"command":["bash","-c","echo hello-from-b"],"wait":false}`, e2e.HdrTenant2)
		r := s.Curl(t, http.MethodGet, e2e.Prefix+"/"+sbB.SandboxID+"/execs/"+ex.ExecID+"/output", nil, e2e.HdrTenant2)
		if r.Status != http.StatusOK || !strings.Contains(string(r.Body), "hello-from-b") || !strings.Contains(string(r.Body), "exit") {
			t.Fatalf("tenant B's output stream: %s", r)
		}
		g := s.GQL(t, `{ profiles { name } }`, nil, e2e.HdrTenant2)
		if len(g.Errors) > 0 {
			t.Fatalf("tenant B's query: %s", g)
		}
	})

	e2e.Step(t, "running-commands-per-sandbox", func(t *testing.T) {
		for range 2 {
			detach(t, s, sbB.SandboxID, `{"command":["sleep","30"],"wait":false}`, e2e.HdrTenant2)
		}
		r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+sbB.SandboxID+"/exec", []byte(`{"command":["true"]}`), e2e.HdrJSON, e2e.HdrTenant2)
		e := r.WantError(t, http.StatusTooManyRequests, "LIMIT_EXCEEDED")
		if r.Header.Get("Retry-After") == "" {
			t.Errorf("no Retry-After: %s (%+v)", r, e)
		}
	})

	e2e.Step(t, "duplicate-operation-id-closes-4409", func(t *testing.T) {
		c := wsOpen(ctx, t, s, e2e.KeyTenant2)
		c.subscribeEvents(ctx, t, "dup", 300*time.Millisecond)
		send(ctx, t, c.c, wsMsg{ID: "dup", Type: "subscribe", Payload: rawJSON(t, map[string]any{
			"query": `subscription { sandboxEvents { cursor } }`})})
		for range c.msgs {
		}
		var ce websocket.CloseError
		if err := <-c.err; !errors.As(err, &ce) || ce.Code != 4409 {
			t.Fatalf("got %v, want close 4409", err)
		}
	})
}

// detach starts a command with wait: false (202).
func detach(t *testing.T, s *e2e.Server, id, body string, headers ...string) e2e.ExecJSON {
	t.Helper()
	r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/exec", []byte(body), append([]string{e2e.HdrJSON}, headers...)...)
	r.Want(t, http.StatusAccepted)
	var e e2e.ExecJSON
	r.Decode(t, &e)
	return e
}

func TestEdgeRateLimitAcrossReplicas(t *testing.T) {
	rs := redistest.Start(t)
	servers := e2e.ReplicasWith(t, e2e.ServerOptions{RedisURL: rs.URL, Extra: map[string]any{
		"rate_limit": map[string]any{"requests_per_sec": 1, "burst": 6,
			"keys": map[string]any{"tenant2": map[string]any{"requests_per_sec": 1000, "burst": 1000}}},
	}}, 2)
	start := time.Now()
	ok, limited := 0, 0
	var last *e2e.Response
	for i := range 12 {
		r := servers[i%2].Curl(t, http.MethodGet, e2e.Prefix+"/quota", nil, e2e.HdrTenant1)
		switch r.Status {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			limited++
			last = r
		default:
			t.Fatalf("request %d: %s", i, r)
		}
	}
	elapsed := time.Since(start)
	t.Logf("12 requests over two replicas in %v: %d allowed, %d limited", elapsed.Round(time.Millisecond), ok, limited)
	if maxOK := 6 + int(elapsed.Seconds()) + 1; ok > maxOK || limited == 0 {
		t.Fatalf("got %d allowed and %d limited in %v, want at most %d allowed: the two replicas share one budget", ok, limited, elapsed, maxOK)
	}
	last.WantError(t, http.StatusTooManyRequests, "RATE_LIMITED")
	if ra, err := strconv.Atoi(last.Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("Retry-After %q, want whole seconds ≥ 1", last.Header.Get("Retry-After"))
	}
	g := servers[1].GQL(t, `{ profiles { name } }`, nil, e2e.HdrTenant1)
	if g.Resp.Status != http.StatusTooManyRequests || len(g.Errors) == 0 || g.Errors[0].Code() != "RATE_LIMITED" {
		t.Errorf("GraphQL over the limit: got %s, want 429 RATE_LIMITED", g)
	}
	var body struct {
		Errors []struct {
			Extensions map[string]any `json:"extensions"`
		} `json:"errors"`
	}
	if json.Unmarshal(g.Resp.Body, &body) != nil || len(body.Errors) == 0 || body.Errors[0].Extensions["retryAfter"] == nil {
		t.Errorf("GraphQL over the limit carries no extensions.retryAfter: %s", g.Resp.Body)
	}
	// Another key's budget is its own.
	for i := range 20 {
		servers[i%2].Curl(t, http.MethodGet, e2e.Prefix+"/quota", nil, e2e.HdrTenant2).Want(t, http.StatusOK)
	}
}

func TestEdgeCORS(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{Extra: map[string]any{
		"graphql": map[string]any{"allowed_origins": []string{"dash.example.test", "*.ops.example.test"}},
	}})
	preflight := func(path, origin string) *e2e.Response {
		return s.Curl(t, http.MethodOptions, path, nil, "Origin: "+origin, "Access-Control-Request-Method: POST",
			"Access-Control-Request-Headers: content-type,x-api-key")
	}
	for _, path := range []string{"/graphql", e2e.Prefix, e2e.Prefix + "/sbx_x/exec"} {
		for _, origin := range []string{"https://dash.example.test", "https://a.ops.example.test"} {
			r := preflight(path, origin)
			if r.Status/100 != 2 || r.Header.Get("Access-Control-Allow-Origin") != origin {
				t.Errorf("%s from %s: got %d ACAO=%q, want 2xx and the origin", path, origin, r.Status, r.Header.Get("Access-Control-Allow-Origin"))
			}
			allowed := strings.ToLower(r.Header.Get("Access-Control-Allow-Headers"))
			if !strings.Contains(allowed, "x-api-key") || !strings.Contains(allowed, "content-type") {
				t.Errorf("%s from %s: Access-Control-Allow-Headers %q lacks x-api-key or content-type", path, origin, allowed)
			}
			if r.Header.Get("Access-Control-Allow-Credentials") != "" {
				t.Errorf("%s from %s: credentials allowed", path, origin)
			}
		}
		for _, origin := range []string{"https://evil.example.test", "https://dash.example.test.evil.test", "null"} {
			r := preflight(path, origin)
			if r.Header.Get("Access-Control-Allow-Origin") != "" {
				t.Errorf("%s from %s: got ACAO %q, want none", path, origin, r.Header.Get("Access-Control-Allow-Origin"))
			}
		}
	}
	// The actual request from an allowed origin is readable by the page, and still needs a key.
	r := s.Curl(t, http.MethodGet, e2e.Prefix+"/quota", nil, "Origin: https://dash.example.test", e2e.HdrDev)
	r.Want(t, http.StatusOK)
	if r.Header.Get("Access-Control-Allow-Origin") != "https://dash.example.test" {
		t.Errorf("GET from an allowed origin: ACAO %q", r.Header.Get("Access-Control-Allow-Origin"))
	}
	r = s.Curl(t, http.MethodGet, e2e.Prefix+"/quota", nil, "Origin: https://dash.example.test")
	r.Want(t, http.StatusUnauthorized)
}
