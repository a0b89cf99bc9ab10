package tracing

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// untraced are the paths whose requests get no span: probes and scrapes, every few seconds.
var untraced = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}

// maxTraceState bounds the tracestate a request may hand on to our spans (W3C allows 32
// members of up to 512 bytes): a longer one is dropped, the traceparent kept, so that no
// client can make every span of its requests kilobytes larger.
const maxTraceState = 512

// maxIDLength bounds an id taken from a request's path into a span (ours are about 30 bytes).
const maxIDLength = 64

// StartServer starts the server span of r: a child of the trace in r's traceparent header
// when it has a valid one, else a new trace. It returns r's context with the span, and end,
// which names the span after the route that served r (a ServeMux pattern's path,
// "/sandbox/sandboxes/v1/{id}/exec", never the request's own path; "" or "other" for none),
// records the status, and ends it. The span's ids are the path's sandbox and exec ids.
// Probes (/healthz, /readyz) and /metrics get no span, nor does anything before Install
// (tracing off).
func StartServer(r *http.Request) (ctx context.Context, end func(route string, status int)) {
	ctx = r.Context()
	if !installed.Load() || untraced[r.URL.Path] {
		return ctx, func(string, int) {}
	}
	ctx = otel.GetTextMapPropagator().Extract(ctx, propagation.HeaderCarrier(r.Header))
	if sc := trace.SpanContextFromContext(ctx); sc.IsRemote() && len(sc.TraceState().String()) > maxTraceState {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc.WithTraceState(trace.TraceState{}))
	}
	m := methodOf(r.Method)
	ctx, span := tracer("sandboxd/http").Start(ctx, spanMethod(m), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(semconv.HTTPRequestMethodKey.String(m), semconv.URLScheme(scheme(r))))
	u := r.URL
	return ctx, func(route string, status int) {
		if !span.IsRecording() { // not sampled
			span.End()
			return
		}
		if route != "" && route != "other" {
			span.SetName(spanMethod(m) + " " + route)
			span.SetAttributes(semconv.HTTPRoute(route))
			for _, kv := range pathIDs(route, u) {
				span.SetAttributes(kv)
			}
		}
		span.SetAttributes(semconv.HTTPResponseStatusCode(status))
		if status >= 500 {
			span.SetStatus(codes.Error, fmt.Sprint(status))
			span.SetAttributes(semconv.ErrorTypeKey.String(fmt.Sprint(status)))
		}
		span.End()
	}
}

// methodOf is the method as a span records it: a known one, or _OTHER.
func methodOf(m string) string {
	switch m {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodHead, http.MethodOptions:
		return m
	}
	return "_OTHER"
}

func spanMethod(m string) string {
	if m == "_OTHER" {
		return "HTTP"
	}
	return m
}

func scheme(r *http.Request) string {
	if r.TLS != nil {
		return "https"
	}
	return "http"
}

// pathIDs are the sandbox and exec ids in u's path where route has the wildcards {id} and
// {exec_id}: a segment that is not an id (too long, or with characters ids never have) is
// left out.
func pathIDs(route string, u *url.URL) []attribute.KeyValue {
	rs := strings.Split(route, "/")
	ps := strings.Split(u.EscapedPath(), "/")
	if len(rs) != len(ps) {
		return nil
	}
	var out []attribute.KeyValue
	for i, seg := range rs {
		var key = KeySandboxID
		switch seg {
		case "{id}":
		case "{exec_id}":
			key = KeyExecID
		default:
			continue
		}
		v, err := url.PathUnescape(ps[i])
		if err != nil || !isID(v) {
			continue
		}
		out = append(out, key.String(v))
	}
	return out
}

// isID reports whether s looks like one of our ids (prefix, underscore, ULID): short, and
// only letters, digits, '_' and '-'.
func isID(s string) bool {
	if s == "" || len(s) > maxIDLength {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
