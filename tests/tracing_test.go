package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"sandboxd/internal/auth"
	"sandboxd/internal/tracing/tracingtest"
	"sandboxd/tests/e2e"
)

// What no exported span may hold: the caller's key, tenant and project, the command it ran and
// what the command printed.
const (
	traceKey     = "e2e-traced-key-secret-5e1f"
	traceTenant  = "tenant-secret-e2e"
	traceProject = "project-secret-e2e"
	traceMarker  = "marker-secret-e2e"
)

// The built server with tracing.endpoint set exports its spans over OTLP/HTTP to a collector
// (a receiver on loopback that decodes them): one REST exec on real runsc is one trace in the
// caller's traceparent, the server span over the driver, guest and Redis script spans; a
// GraphQL operation over a WebSocket joins the trace of the upgrade request's traceparent.
// A hostile client's tracestate is dropped, its malformed traceparent ignored, and nothing
// of the tenant's reaches the collector.
func TestTracingExportsOneExecEndToEnd(t *testing.T) {
	recv := tracingtest.Start(t)
	s := e2e.StartServer(t, e2e.ServerOptions{
		Extra: map[string]any{
			"tracing":  map[string]any{"endpoint": recv.URL, "service_name": "sandboxd-e2e"},
			"api_keys": []map[string]any{{"name": "traced", "sha256": auth.HashKey(traceKey), "tenant": traceTenant, "project": traceProject}},
		},
		Env: []string{"OTEL_BSP_SCHEDULE_DELAY=100"}, // export every 100 ms rather than 5 s
	})
	hdrKey := "X-Api-Key: " + traceKey
	id := s.Create(t, `{"profile":"sandboxes-default"}`, hdrKey).SandboxID

	noSecrets := func(t *testing.T, spans []tracingtest.Span) {
		t.Helper()
		for _, sp := range spans {
			for k, v := range sp.Attrs {
				for _, secret := range []string{traceKey, traceTenant, traceProject, traceMarker} {
					if strings.Contains(v, secret) {
						t.Errorf("%s: attribute %s = %q holds %q", sp.Name, k, v, secret)
					}
				}
			}
			if strings.Contains(sp.Name, id) {
				t.Errorf("span name %q holds the sandbox id", sp.Name)
			}
		}
	}
	find := func(t *testing.T, spans []tracingtest.Span, name string) tracingtest.Span {
		t.Helper()
		for _, sp := range spans {
			if sp.Name == name {
				return sp
			}
		}
		t.Fatalf("no span %q in %s", name, tracingtest.Names(spans))
		return tracingtest.Span{}
	}
	has := func(names ...string) func([]tracingtest.Span) bool {
		return func(spans []tracingtest.Span) bool {
			seen := map[string]bool{}
			for _, sp := range spans {
				seen[sp.Name] = true
			}
			for _, n := range names {
				if !seen[n] {
					return false
				}
			}
			return true
		}
	}

	e2e.Step(t, "rest-exec", func(t *testing.T) {
		const traceID, caller = "8bf92f3577b34da6a3ce929d0e0e4736", "d0f067aa0ba902b7"
		long := "vendor=" + strings.Repeat("v", 250) + ",other=" + strings.Repeat("w", 250) + ",third=" + strings.Repeat("x", 250)
		res := s.Exec(t, id, e2e.MustJSON(t, map[string]any{"command": []string{"sh", "-c", "echo " + traceMarker}}),
			hdrKey, "traceparent: 00-"+traceID+"-"+caller+"-01", "tracestate: "+long)
		if res.ExitCode != 0 || !strings.Contains(res.Stdout, traceMarker) {
			t.Fatalf("exec: %+v", res)
		}
		const server, guest = "POST /sandbox/sandboxes/v1/{id}/exec", "guest POST /v1/execs"
		spans := recv.WaitFor(t, traceID, 20*time.Second, has(server, "driver.Get", guest, "redis execstream.(*Store).Create"))
		root := find(t, spans, server)
		if root.ParentSpanID != caller {
			t.Errorf("server span's parent %s, want the traceparent's %s", root.ParentSpanID, caller)
		}
		for k, want := range map[string]string{"http.route": "/sandbox/sandboxes/v1/{id}/exec", "http.response.status_code": "200",
			"sandboxd.sandbox.id": id, "sandboxd.exec.id": res.ExecID} {
			if got := root.Attrs[k]; got != want {
				t.Errorf("server span: %s = %q, want %q", k, got, want)
			}
		}
		if root.Resource["service.name"] != "sandboxd-e2e" {
			t.Errorf("resource %v, want service.name sandboxd-e2e", root.Resource)
		}
		get, g := find(t, spans, "driver.Get"), find(t, spans, guest)
		if get.ParentSpanID != root.SpanID || get.Attrs["sandboxd.runtime"] != "gvisor" || get.Attrs["sandboxd.sandbox.id"] != id {
			t.Errorf("driver.Get: parent %s attrs %v", get.ParentSpanID, get.Attrs)
		}
		if g.ParentSpanID != root.SpanID || g.Attrs["sandboxd.exec.id"] != res.ExecID {
			t.Errorf("%s: parent %s attrs %v", guest, g.ParentSpanID, g.Attrs)
		}
		for _, sp := range spans {
			if sp.TraceState != "" {
				t.Errorf("%s carries the caller's %d-byte tracestate", sp.Name, len(sp.TraceState))
			}
			if sp.SpanID != root.SpanID && sp.ParentSpanID == "" {
				t.Errorf("%s is a second root in the trace", sp.Name)
			}
		}
		noSecrets(t, spans)
	})

	e2e.Step(t, "malformed-traceparent", func(t *testing.T) {
		res := s.Exec(t, id, `{"command":["true"]}`, hdrKey, "traceparent: 00-"+strings.Repeat("f", 32)+"-zz-01")
		if res.ExitCode != 0 {
			t.Fatalf("exec: %+v", res)
		}
		if got := recv.Trace(strings.Repeat("f", 32)); len(got) > 0 {
			t.Errorf("a malformed traceparent's trace id was used: %s", tracingtest.Names(got))
		}
	})

	e2e.Step(t, "graphql-websocket", func(t *testing.T) {
		const traceID, caller = "9bf92f3577b34da6a3ce929d0e0e4736", "e0f067aa0ba902b7"
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		h := http.Header{}
		h.Set("traceparent", "00-"+traceID+"-"+caller+"-01")
		c, resp, err := websocket.Dial(ctx, "ws://"+s.Addr+"/graphql",
			&websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}, HTTPHeader: h})
		if err != nil {
			t.Fatalf("dial: %v (%v)", err, resp)
		}
		defer c.CloseNow()
		send(ctx, t, c, wsMsg{Type: "connection_init", Payload: rawJSON(t, map[string]any{"X-Api-Key": traceKey})})
		if m := nextMsg(ctx, t, c); m.Type != "connection_ack" {
			t.Fatalf("got %s %s, want connection_ack", m.Type, m.Payload)
		}
		send(ctx, t, c, wsMsg{ID: "1", Type: "subscribe", Payload: rawJSON(t, map[string]any{
			"query":     `mutation($id: ID!, $cmd: [String!]!) { exec(sandboxId: $id, input: {command: $cmd}) { exec { execId exitCode } } }`,
			"variables": map[string]any{"id": id, "cmd": []string{"sh", "-c", "echo " + traceMarker}}})})
		m := nextMsg(ctx, t, c)
		var out struct {
			Data struct {
				Exec struct {
					Exec struct {
						ExecID string `json:"execId"`
					} `json:"exec"`
				} `json:"exec"`
			} `json:"data"`
		}
		if m.Type != "next" || json.Unmarshal(m.Payload, &out) != nil || out.Data.Exec.Exec.ExecID == "" {
			t.Fatalf("got %s %s, want the exec's result", m.Type, m.Payload)
		}
		c.Close(websocket.StatusNormalClosure, "")
		spans := recv.WaitFor(t, traceID, 20*time.Second, has("GET /graphql", "graphql.mutation", "Mutation.exec", "guest POST /v1/execs"))
		root, op, field := find(t, spans, "GET /graphql"), find(t, spans, "graphql.mutation"), find(t, spans, "Mutation.exec")
		if root.ParentSpanID != caller || op.ParentSpanID != root.SpanID || field.ParentSpanID != op.SpanID {
			t.Errorf("want upgrade (parent %s) → operation → resolver; got parents %s, %s, %s", caller, root.ParentSpanID, op.ParentSpanID, field.ParentSpanID)
		}
		if root.Attrs["http.response.status_code"] != "101" {
			t.Errorf("upgrade span status %q, want 101", root.Attrs["http.response.status_code"])
		}
		if g := find(t, spans, "guest POST /v1/execs"); g.ParentSpanID != field.SpanID || g.Attrs["sandboxd.exec.id"] != out.Data.Exec.Exec.ExecID {
			t.Errorf("guest span: parent %s attrs %v, want under the resolver with exec %s", g.ParentSpanID, g.Attrs, out.Data.Exec.Exec.ExecID)
		}
		noSecrets(t, spans)
	})

	if bad := recv.Bad(); len(bad) > 0 {
		t.Errorf("the collector refused what sandboxd sent: %v", bad)
	}
}

// A collector that accepts connections and never answers costs the server nothing its callers
// see: a flood of requests that each ask for their trace to be sampled is served at once (the
// spans wait in a bounded queue, then are dropped), and shutdown ends within its flush bound.
func TestTracingCollectorThatHangs(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never read
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	s := e2e.StartServer(t, e2e.ServerOptions{
		Extra: map[string]any{"tracing": map[string]any{"endpoint": "http://" + ln.Addr().String()}},
		Env:   []string{"OTEL_BSP_SCHEDULE_DELAY=50"},
	})
	const workers, each = 16, 40
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	var slowest time.Duration
	var smu sync.Mutex
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				tp := fmt.Sprintf("traceparent: 00-%032x-%016x-01", w*1000+i+1, w*1000+i+1)
				start := time.Now()
				r, err := s.Send(http.MethodGet, e2e.Prefix, nil, e2e.HdrDev, tp)
				d := time.Since(start)
				smu.Lock()
				slowest = max(slowest, d)
				smu.Unlock()
				if err != nil {
					errs <- err
				} else if r.Status != http.StatusOK {
					errs <- fmt.Errorf("status %d: %s", r.Status, r.Body)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a request during the flood: %v", err)
	}
	// A request that waited on the collector would wait out an export's bound (10 s): a
	// slowest answer under it shows none did. A tighter bound measured the machine's load (a
	// request took 3.9 s on a machine at load 50), not the exporter.
	if slowest >= 10*time.Second {
		t.Errorf("the slowest of %d requests took %s with the collector hanging, want under the export bound (10 s)", workers*each, slowest)
	}
	start := time.Now()
	s.Stop(t)
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("shutdown took %s with the collector hanging, want the flush bound (5 s) plus the server's own", d)
	}
	t.Logf("%d requests, slowest %s; shutdown %s", workers*each, slowest.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}
