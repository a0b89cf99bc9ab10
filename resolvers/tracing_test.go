package resolvers

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/auth"
	"sandboxd/internal/tracing"
	"sandboxd/internal/tracing/tracingtest"
)

// tracedEnv serves /graphql behind the server span sandboxd's middleware makes, so that a
// request's spans are one trace (its traceparent's).
func tracedEnv(t *testing.T, opts HandlerOptions) (*httptest.Server, *apitest.Fake) {
	fake := apitest.New()
	h := NewHandler(fake, apitest.Authenticator(t), opts)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, end := tracing.StartServer(r)
		h.ServeHTTP(w, r.WithContext(ctx))
		end("/graphql", 200)
	}))
	t.Cleanup(srv.Close)
	return srv, fake
}

// postTraced sends a GraphQL request in trace traceID and returns the trace's spans.
func postTraced(t *testing.T, srv *httptest.Server, rec interface {
	Ended() []sdktrace.ReadOnlySpan
}, traceID, query string) []sdktrace.ReadOnlySpan {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"query": query})
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/graphql", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(auth.HeaderAPIKey, apitest.UserKey)
	req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID().String() == traceID {
			out = append(out, s)
		}
	}
	return out
}

func byName(spans []sdktrace.ReadOnlySpan) map[string][]sdktrace.ReadOnlySpan {
	m := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		m[s.Name()] = append(m[s.Name()], s)
	}
	return m
}

func spanAttr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// An operation is a span under the request's; each field with a resolver of its own is a
// span under the operation's; fields without one (ExecResult's) get none.
func TestTracingOperationAndResolverSpans(t *testing.T) {
	rec := tracingtest.Record(t)
	srv, _ := tracedEnv(t, HandlerOptions{})
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	spans := postTraced(t, srv, rec, traceID, `mutation Run { exec(sandboxId: "`+apitest.SandboxRunning+
		`", input: {command: ["echo", "secret-argv"]}) { exec { execId exitCode stdout } } }`)
	m := byName(spans)
	if len(spans) != 3 || len(m["POST /graphql"]) != 1 || len(m["graphql.mutation"]) != 1 || len(m["Mutation.exec"]) != 1 {
		t.Fatalf("spans %v, want the request's, graphql.mutation and Mutation.exec", names(spans))
	}
	server, op, field := m["POST /graphql"][0], m["graphql.mutation"][0], m["Mutation.exec"][0]
	if op.Parent().SpanID() != server.SpanContext().SpanID() || field.Parent().SpanID() != op.SpanContext().SpanID() {
		t.Errorf("want request → operation → resolver; parents: op %v, field %v", op.Parent().SpanID(), field.Parent().SpanID())
	}
	if got := spanAttr(op, "graphql.operation.type") + " " + spanAttr(op, "graphql.operation.name"); got != "mutation Run" {
		t.Errorf("operation attributes %q, want %q", got, "mutation Run")
	}
	for _, s := range spans {
		if s.Status().Code == codes.Error {
			t.Errorf("%s failed: %v", s.Name(), s.Status())
		}
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.Emit(), "secret") || strings.Contains(kv.Value.Emit(), "echo") {
				t.Errorf("%s: attribute %s = %q holds the command", s.Name(), kv.Key, kv.Value.Emit())
			}
		}
	}
}

// A failed resolver fails its span and the operation's with the error's code.
func TestTracingErrorCodes(t *testing.T) {
	rec := tracingtest.Record(t)
	srv, _ := tracedEnv(t, HandlerOptions{})
	const traceID = "1af7651916cd43dd8448eb211c80319c"
	spans := postTraced(t, srv, rec, traceID, `{ sandbox(id: "sbx_someone_elses") { id } }`)
	m := byName(spans)
	if len(m["graphql.query"]) != 1 || len(m["Query.sandbox"]) != 1 {
		t.Fatalf("spans %v", names(spans))
	}
	for _, s := range []sdktrace.ReadOnlySpan{m["graphql.query"][0], m["Query.sandbox"][0]} {
		if s.Status().Code != codes.Error || s.Status().Description != "NOT_FOUND" || spanAttr(s, "sandboxd.error.code") != "NOT_FOUND" {
			t.Errorf("%s: status %v code %q, want NOT_FOUND", s.Name(), s.Status(), spanAttr(s, "sandboxd.error.code"))
		}
	}
	// An uncoded error is INTERNAL on the span, and its text (a secret) is nowhere.
	spans = postTraced(t, srv, rec, "2af7651916cd43dd8448eb211c80319c", `{ sandbox(id: "`+apitest.SandboxBoom+`") { id } }`)
	for _, s := range spans {
		if s.Name() == "Query.sandbox" && s.Status().Description != "INTERNAL" {
			t.Errorf("%s: status %v, want INTERNAL", s.Name(), s.Status())
		}
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.Emit(), "hunter2") {
				t.Errorf("%s: attribute %s carries the error's text", s.Name(), kv.Key)
			}
		}
		for _, ev := range s.Events() {
			t.Errorf("%s: event %q: errors are codes, not recorded messages", s.Name(), ev.Name)
		}
	}
}

// One operation makes at most maxResolverSpans resolver spans, however many fields it
// resolves, and says how many it left out; a long operation name is not recorded.
func TestTracingResolverSpansAreBounded(t *testing.T) {
	rec := tracingtest.Record(t)
	srv, _ := tracedEnv(t, HandlerOptions{ComplexityLimit: 1 << 20})
	const n = maxResolverSpans + 36
	var q strings.Builder
	q.WriteString("query " + strings.Repeat("Q", maxOperationName+1) + " {")
	for i := range n {
		fmt.Fprintf(&q, " a%d: sandbox(id: %q) { id }", i, apitest.SandboxRunning)
	}
	q.WriteString(" }")
	spans := postTraced(t, srv, rec, "3af7651916cd43dd8448eb211c80319c", q.String())
	m := byName(spans)
	if got := len(m["Query.sandbox"]); got != maxResolverSpans {
		t.Errorf("%d resolver spans, want %d", got, maxResolverSpans)
	}
	op := m["graphql.query"]
	if len(op) != 1 {
		t.Fatalf("spans %v", names(spans))
	}
	if got := spanAttr(op[0], "sandboxd.graphql.resolver_spans_dropped"); got != fmt.Sprint(n-maxResolverSpans) {
		t.Errorf("dropped %q, want %d", got, n-maxResolverSpans)
	}
	if got := spanAttr(op[0], "graphql.operation.name"); got != "" {
		t.Errorf("a %d-byte operation name was recorded: %q", maxOperationName+1, got)
	}
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}
