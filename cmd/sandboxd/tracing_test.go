package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"sandboxd/internal/auth"
	"sandboxd/internal/domain"
	"sandboxd/internal/domain/domaintest"
	"sandboxd/internal/rest"
	"sandboxd/internal/tracing"
	"sandboxd/internal/tracing/tracingtest"
	"sandboxd/resolvers"
)

// What the spans of one request may never hold: its tenant, project and key, and the
// command it ran (and its output).
const (
	traceKey     = "key-secret-7f3a9c"
	traceTenant  = "tenant-secret-41"
	traceProject = "project-secret-42"
	traceCommand = "marker-secret-43"
)

// tracedServer is the server's real handler chain (instrument around newMux, the REST and
// GraphQL handlers) over the real domain service on the fake runtime (a real guest init on
// the host), with the driver wrapped and the Redis hooks added as run does.
func tracedServer(t *testing.T) *httptest.Server {
	t.Helper()
	env := domaintest.New(t, domaintest.Options{Deps: func(d *domain.Deps) { d.Driver = tracing.Driver(d.Driver) }})
	tracing.Redis(env.Redis.Client)
	authn, err := auth.New([]auth.Key{{Name: "k", SHA256: auth.HashKey(traceKey), Tenant: traceTenant, Project: traceProject}})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	shutdown, endStreams := context.WithCancel(context.Background())
	t.Cleanup(endStreams)
	stub := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	mux := newMux(handlers{ready: stub, metrics: stub, graphiql: stub, openapi: stub,
		graphql: resolvers.NewHandler(env.Svc, authn, resolvers.HandlerOptions{Logger: log, Shutdown: shutdown}),
		rest:    rest.New(env.Svc, authn, log, shutdown.Done())})
	srv := httptest.NewServer(instrument(mux, prometheus.NewRegistry()))
	t.Cleanup(srv.Close)
	return srv
}

// call sends a request with the test's key and a traceparent, and decodes the JSON answer.
func call(t *testing.T, srv *httptest.Server, method, path, traceparent string, body, out any) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(method, srv.URL+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(auth.HeaderAPIKey, traceKey)
	if traceparent != "" {
		req.Header.Set("traceparent", traceparent)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatalf("%s %s: %v: %s", method, path, err, raw)
	}
}

// traceOf waits until the spans of traceID include every name in want (the guest call of an
// exec ends with its log, just after the answer) and returns them.
func traceOf(t *testing.T, rec *tracetest.SpanRecorder, traceID string, want ...string) []sdktrace.ReadOnlySpan {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var spans []sdktrace.ReadOnlySpan
		have := map[string]bool{}
		for _, s := range rec.Ended() {
			if s.SpanContext().TraceID().String() == traceID {
				spans = append(spans, s)
				have[s.Name()] = true
			}
		}
		missing := false
		for _, w := range want {
			missing = missing || !have[w]
		}
		if !missing {
			return spans
		}
		if time.Now().After(deadline) {
			var names []string
			for _, s := range spans {
				names = append(names, s.Name())
			}
			t.Fatalf("trace %s: spans %q, want at least %q", traceID, names, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func traceAttr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// checkTree checks that spans form one tree under root, whose parent is the caller's span
// (the traceparent's), and that no span holds what it must not.
func checkTree(t *testing.T, spans []sdktrace.ReadOnlySpan, root sdktrace.ReadOnlySpan, callerSpan string) {
	t.Helper()
	if got := root.Parent().SpanID().String(); got != callerSpan || !root.Parent().IsRemote() {
		t.Errorf("%s: parent %s (remote %v), want the traceparent's span %s", root.Name(), got, root.Parent().IsRemote(), callerSpan)
	}
	ids := map[string]bool{}
	for _, s := range spans {
		ids[s.SpanContext().SpanID().String()] = true
	}
	for _, s := range spans {
		if s != root && !ids[s.Parent().SpanID().String()] {
			t.Errorf("%s: its parent %s is not a span of the trace", s.Name(), s.Parent().SpanID())
		}
		for _, kv := range s.Attributes() {
			v := kv.Value.Emit()
			for _, secret := range []string{traceKey, traceTenant, traceProject, traceCommand} {
				if strings.Contains(v, secret) {
					t.Errorf("%s: attribute %s = %q holds %q", s.Name(), kv.Key, v, secret)
				}
			}
		}
		if strings.Contains(s.Name(), "sbx_") || strings.Contains(s.Name(), "exec_") {
			t.Errorf("span name %q holds an id", s.Name())
		}
	}
}

// logTree logs the trace as an indented tree (go test -v shows it).
func logTree(t *testing.T, spans []sdktrace.ReadOnlySpan, root sdktrace.ReadOnlySpan) {
	t.Helper()
	var b strings.Builder
	var walk func(s sdktrace.ReadOnlySpan, depth int)
	walk = func(s sdktrace.ReadOnlySpan, depth int) {
		fmt.Fprintf(&b, "\n%s%s (%s)", strings.Repeat("  ", depth), s.Name(), s.EndTime().Sub(s.StartTime()).Round(time.Microsecond))
		for _, c := range spans {
			if c.Parent().SpanID() == s.SpanContext().SpanID() {
				walk(c, depth+1)
			}
		}
	}
	walk(root, 0)
	t.Logf("trace %s:%s", root.SpanContext().TraceID(), b.String())
}

// parentOf finds the span named name and checks that its parent is want.
func parentOf(t *testing.T, spans []sdktrace.ReadOnlySpan, name string, want sdktrace.ReadOnlySpan) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range spans {
		if s.Name() == name {
			if s.Parent().SpanID() != want.SpanContext().SpanID() {
				t.Errorf("%s: parent %s, want %s (%s)", name, s.Parent().SpanID(), want.SpanContext().SpanID(), want.Name())
			}
			return s
		}
	}
	t.Fatalf("no span %s", name)
	return nil
}

// The spans of one REST exec, through the server's real handlers and the domain service: the
// HTTP server span (in the caller's trace, named by its route, with the sandbox's and the
// exec's ids) and under it the driver, guest and Redis script spans the exec made.
func TestTraceOfOneRESTExec(t *testing.T) {
	rec := tracingtest.Record(t)
	srv := tracedServer(t)
	var sb struct {
		ID string `json:"sandbox_id"`
	}
	call(t, srv, http.MethodPost, "/sandbox/sandboxes/v1", "", map[string]any{}, &sb)

	const traceID, callerSpan = "5bf92f3577b34da6a3ce929d0e0e4736", "a0f067aa0ba902b7"
	var ex struct {
		ExecID   string `json:"exec_id"`
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
	}
	call(t, srv, http.MethodPost, "/sandbox/sandboxes/v1/"+sb.ID+"/exec", "00-"+traceID+"-"+callerSpan+"-01",
		map[string]any{"command": []string{"sh", "-c", "echo " + traceCommand}}, &ex)
	if ex.ExitCode != 0 || !strings.Contains(ex.Stdout, traceCommand) {
		t.Fatalf("exec: %+v", ex)
	}
	const server, guest = "POST /sandbox/sandboxes/v1/{id}/exec", "guest POST /v1/execs"
	spans := traceOf(t, rec, traceID, server, "driver.Get", guest, "redis execstream.(*Store).Create")
	var root sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == server {
			root = s
		}
	}
	checkTree(t, spans, root, callerSpan)
	logTree(t, spans, root)
	for k, want := range map[string]string{"http.route": "/sandbox/sandboxes/v1/{id}/exec", "http.response.status_code": "200",
		"sandboxd.sandbox.id": sb.ID, "sandboxd.exec.id": ex.ExecID} {
		if got := traceAttr(root, k); got != want {
			t.Errorf("server span: %s = %q, want %q", k, got, want)
		}
	}
	if got := traceAttr(parentOf(t, spans, "driver.Get", root), "sandboxd.sandbox.id"); got != sb.ID {
		t.Errorf("driver.Get: sandbox %q, want %q", got, sb.ID)
	}
	if got := traceAttr(parentOf(t, spans, guest, root), "sandboxd.exec.id"); got != ex.ExecID {
		t.Errorf("%s: exec %q, want %q", guest, got, ex.ExecID)
	}
	parentOf(t, spans, "redis execstream.(*Store).Create", root)
	for _, s := range spans {
		if s.EndTime().Before(s.StartTime()) {
			t.Errorf("%s did not end", s.Name())
		}
	}
}

// The same exec over GraphQL: request → operation → resolver → the driver and guest calls.
func TestTraceOfOneGraphQLExec(t *testing.T) {
	rec := tracingtest.Record(t)
	srv := tracedServer(t)
	var sb struct {
		ID string `json:"sandbox_id"`
	}
	call(t, srv, http.MethodPost, "/sandbox/sandboxes/v1", "", map[string]any{}, &sb)

	const traceID, callerSpan = "6bf92f3577b34da6a3ce929d0e0e4736", "b0f067aa0ba902b7"
	var out struct {
		Data struct {
			Exec struct {
				Exec struct {
					ExecID   string `json:"execId"`
					ExitCode int    `json:"exitCode"`
				} `json:"exec"`
			} `json:"exec"`
		} `json:"data"`
		Errors []any `json:"errors"`
	}
	q := `mutation($id: ID!, $cmd: [String!]!) { exec(sandboxId: $id, input: {command: $cmd}) { exec { execId exitCode } } }`
	call(t, srv, http.MethodPost, "/graphql", "00-"+traceID+"-"+callerSpan+"-01",
		map[string]any{"query": q, "variables": map[string]any{"id": sb.ID, "cmd": []string{"sh", "-c", "echo " + traceCommand}}}, &out)
	if len(out.Errors) > 0 || out.Data.Exec.Exec.ExecID == "" {
		t.Fatalf("exec: %+v", out)
	}
	const guest = "guest POST /v1/execs"
	spans := traceOf(t, rec, traceID, "POST /graphql", "graphql.mutation", "Mutation.exec", "driver.Get", guest)
	var root sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == "POST /graphql" {
			root = s
		}
	}
	checkTree(t, spans, root, callerSpan)
	logTree(t, spans, root)
	op := parentOf(t, spans, "graphql.mutation", root)
	field := parentOf(t, spans, "Mutation.exec", op)
	parentOf(t, spans, "driver.Get", field)
	if got := traceAttr(parentOf(t, spans, guest, field), "sandboxd.exec.id"); got != out.Data.Exec.Exec.ExecID {
		t.Errorf("%s: exec %q, want %q", guest, got, out.Data.Exec.Exec.ExecID)
	}
	if got := traceAttr(field, "sandboxd.exec.id"); got != out.Data.Exec.Exec.ExecID {
		t.Errorf("Mutation.exec: exec %q, want %q", got, out.Data.Exec.Exec.ExecID)
	}
}

// Another tenant's sandbox is NOT_FOUND, and its trace says so by code only.
func TestTraceOfARefusedRequest(t *testing.T) {
	rec := tracingtest.Record(t)
	srv := tracedServer(t)
	const traceID, callerSpan = "7bf92f3577b34da6a3ce929d0e0e4736", "c0f067aa0ba902b7"
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/sandbox/sandboxes/v1/sbx_01HZZZZZZZZZZZZZZZZZZZZZZZ", nil)
	req.Header.Set(auth.HeaderAPIKey, traceKey)
	req.Header.Set("traceparent", "00-"+traceID+"-"+callerSpan+"-01")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("status %d, want 404", resp.StatusCode)
	}
	spans := traceOf(t, rec, traceID, "GET /sandbox/sandboxes/v1/{id}")
	root := spans[len(spans)-1]
	checkTree(t, spans, root, callerSpan)
	if got := traceAttr(root, "sandboxd.error.code"); got != "NOT_FOUND" {
		t.Errorf("error code %q, want NOT_FOUND", got)
	}
	if got := traceAttr(root, "http.response.status_code"); got != "404" {
		t.Errorf("status %q, want 404", got)
	}
}
