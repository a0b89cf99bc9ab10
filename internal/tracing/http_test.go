package tracing_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"sandboxd/internal/tracing"
	"sandboxd/internal/tracing/tracingtest"
)

const (
	parentTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentSpan  = "00f067aa0ba902b7"
	traceparent = "00-" + parentTrace + "-" + parentSpan + "-01"
)

// serve runs one request through StartServer as the server's middleware does, with the given
// route and status, and returns the span it ended (nil for none).
func serve(t *testing.T, rec *tracetest.SpanRecorder, r *http.Request, route string, status int) sdktrace.ReadOnlySpan {
	t.Helper()
	before := len(rec.Ended())
	ctx, end := tracing.StartServer(r)
	if sc := trace.SpanContextFromContext(ctx); len(rec.Ended()) != before {
		t.Fatalf("a span ended before the request did (%v)", sc)
	}
	end(route, status)
	ended := rec.Ended()
	switch len(ended) - before {
	case 0:
		return nil
	case 1:
		return ended[len(ended)-1]
	}
	t.Fatalf("one request ended %d spans", len(ended)-before)
	return nil
}

func attr(s sdktrace.ReadOnlySpan, key string) (string, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit(), true
		}
	}
	return "", false
}

func TestServerSpanContinuesTheCallersTrace(t *testing.T) {
	rec := tracingtest.Record(t)
	r := httptest.NewRequest(http.MethodPost, "/sandbox/sandboxes/v1/sbx_01J0ABCDEF/exec", nil)
	r.Header.Set("traceparent", traceparent)
	s := serve(t, rec, r, "/sandbox/sandboxes/v1/{id}/exec", 200)
	if s == nil {
		t.Fatal("no span")
	}
	if got := s.SpanContext().TraceID().String(); got != parentTrace {
		t.Errorf("trace id %s, want the traceparent's %s", got, parentTrace)
	}
	if got := s.Parent().SpanID().String(); got != parentSpan || !s.Parent().IsRemote() {
		t.Errorf("parent %s (remote %v), want the traceparent's span %s", got, s.Parent().IsRemote(), parentSpan)
	}
	if s.SpanKind() != trace.SpanKindServer {
		t.Errorf("kind %v, want server", s.SpanKind())
	}
	if got, want := s.Name(), "POST /sandbox/sandboxes/v1/{id}/exec"; got != want {
		t.Errorf("name %q, want %q", got, want)
	}
	for k, want := range map[string]string{"http.route": "/sandbox/sandboxes/v1/{id}/exec", "http.request.method": "POST",
		"http.response.status_code": "200", "sandboxd.sandbox.id": "sbx_01J0ABCDEF"} {
		if got, _ := attr(s, k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if s.Status().Code == codes.Error {
		t.Errorf("status %v, want unset for a 200", s.Status())
	}
}

func TestServerSpanWithoutTraceparentIsARoot(t *testing.T) {
	rec := tracingtest.Record(t)
	for _, tp := range []string{"", "00-zz-00f067aa0ba902b7-01", "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"ff-" + parentTrace + "-" + parentSpan + "-01", strings.Repeat("0", 4096)} {
		r := httptest.NewRequest(http.MethodGet, "/sandbox/sandboxes/v1", nil)
		if tp != "" {
			r.Header.Set("traceparent", tp)
		}
		s := serve(t, rec, r, "/sandbox/sandboxes/v1", 200)
		if s == nil {
			t.Fatalf("traceparent %.40q: no span", tp)
		}
		if s.Parent().IsValid() || s.SpanContext().TraceID().String() == parentTrace {
			t.Errorf("traceparent %.40q: parent %v, want a new trace", tp, s.Parent())
		}
	}
}

// A caller cannot make every span of its requests carry kilobytes of tracestate.
func TestServerSpanDropsALongTracestate(t *testing.T) {
	rec := tracingtest.Record(t)
	var members []string
	for i := range 32 {
		members = append(members, "k"+strings.Repeat("x", 8)+string(rune('a'+i%26))+string(rune('a'+i/26))+"="+strings.Repeat("v", 200))
	}
	for _, tc := range []struct {
		name, state string
		kept        bool
	}{
		{"short", "vendor=abc", true},
		{"long", strings.Join(members, ","), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/sandbox/sandboxes/v1", nil)
			r.Header.Set("traceparent", traceparent)
			r.Header.Set("tracestate", tc.state)
			s := serve(t, rec, r, "/sandbox/sandboxes/v1", 200)
			if got := s.SpanContext().TraceID().String(); got != parentTrace {
				t.Errorf("trace id %s, want %s: the traceparent is kept either way", got, parentTrace)
			}
			got := s.SpanContext().TraceState().String()
			if tc.kept && got != tc.state || !tc.kept && got != "" {
				t.Errorf("tracestate %d bytes, want kept=%v (%d bytes sent)", len(got), tc.kept, len(tc.state))
			}
		})
	}
}

// The ids a span takes from the path are the route's {id} and {exec_id}, and only when they
// look like ids: a client's junk in the path never becomes an attribute.
func TestServerSpanIDsFromThePath(t *testing.T) {
	rec := tracingtest.Record(t)
	const route = "/sandbox/sandboxes/v1/{id}/execs/{exec_id}"
	for _, tc := range []struct {
		name, path, sandbox, exec string
	}{
		{"both", "/sandbox/sandboxes/v1/sbx_01ABC/execs/exec_01DEF", "sbx_01ABC", "exec_01DEF"},
		{"too_long", "/sandbox/sandboxes/v1/" + strings.Repeat("a", 65) + "/execs/exec_1", "", "exec_1"},
		{"escaped_slash", "/sandbox/sandboxes/v1/a%2Fb/execs/exec_1", "", "exec_1"},
		{"spaces_and_quotes", "/sandbox/sandboxes/v1/a%20%22b/execs/%00", "", ""},
		{"tenant_like", "/sandbox/sandboxes/v1/acme:evals/execs/x", "", "x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, tc.path, nil)
			s := serve(t, rec, r, route, 404)
			sb, _ := attr(s, "sandboxd.sandbox.id")
			ex, _ := attr(s, "sandboxd.exec.id")
			if sb != tc.sandbox || ex != tc.exec {
				t.Errorf("got sandbox %q exec %q, want %q %q", sb, ex, tc.sandbox, tc.exec)
			}
		})
	}
}

func TestServerSpanStatus(t *testing.T) {
	rec := tracingtest.Record(t)
	for _, tc := range []struct {
		status int
		failed bool
	}{{101, false}, {404, false}, {429, false}, {500, true}, {503, true}} {
		s := serve(t, rec, httptest.NewRequest(http.MethodGet, "/graphql", nil), "/graphql", tc.status)
		if got := s.Status().Code == codes.Error; got != tc.failed {
			t.Errorf("status %d: failed %v, want %v", tc.status, got, tc.failed)
		}
	}
	// No route: the span keeps the method as its name; an unknown method is _OTHER.
	s := serve(t, rec, httptest.NewRequest("BREW", "/nowhere/sbx_1", nil), "other", 404)
	if s.Name() != "HTTP" {
		t.Errorf("name %q, want HTTP", s.Name())
	}
	if got, _ := attr(s, "http.request.method"); got != "_OTHER" {
		t.Errorf("method %q, want _OTHER", got)
	}
	if _, ok := attr(s, "http.route"); ok {
		t.Error("a request no route took has an http.route")
	}
}

// Probes and scrapes come every few seconds: no spans for them.
func TestServerSpanNoneForProbes(t *testing.T) {
	rec := tracingtest.Record(t)
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		r := httptest.NewRequest(http.MethodGet, p, nil)
		r.Header.Set("traceparent", traceparent)
		if s := serve(t, rec, r, p, 200); s != nil {
			t.Errorf("%s: got span %q, want none", p, s.Name())
		}
	}
}
