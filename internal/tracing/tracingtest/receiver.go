// Package tracingtest is test-only: an OTLP/HTTP trace receiver on loopback (what a collector
// does with the spans sandboxd exports: decode the protobuf, gzip or not) that keeps the
// spans it got for a test to look at.
package tracingtest

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, flattened for tests.
type Span struct {
	Name         string
	TraceID      string // hex
	SpanID       string // hex
	ParentSpanID string // hex; "" for a root span
	Kind         tracepb.Span_SpanKind
	TraceState   string
	// Attrs are the span's attributes as text; Resource are its resource's.
	Attrs    map[string]string
	Resource map[string]string
	Error    bool   // status ERROR
	Status   string // the status's message
	Scope    string // the instrumentation scope
}

// Receiver is an OTLP/HTTP endpoint on loopback: POST /v1/traces.
type Receiver struct {
	// URL is the receiver's base URL (http://127.0.0.1:port): tracing.endpoint.
	URL string

	srv      *httptest.Server
	mu       sync.Mutex
	spans    []Span
	requests int
	bad      []string
}

// maxBody bounds one export request the receiver reads.
const maxBody = 64 << 20

// Start starts a receiver; it stops when the test ends.
func Start(t testing.TB) *Receiver {
	r := &Receiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	r.URL = r.srv.URL
	t.Cleanup(r.srv.Close)
	return r
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		r.fail(w, fmt.Sprintf("unexpected %s %s", req.Method, req.URL.Path), http.StatusNotFound)
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		r.fail(w, "unexpected content type "+ct, http.StatusUnsupportedMediaType)
		return
	}
	var body io.Reader = http.MaxBytesReader(w, req.Body, maxBody)
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(body)
		if err != nil {
			r.fail(w, "gzip: "+err.Error(), http.StatusBadRequest)
			return
		}
		body = io.LimitReader(zr, maxBody)
	}
	b, err := io.ReadAll(body)
	if err != nil {
		r.fail(w, "read: "+err.Error(), http.StatusBadRequest)
		return
	}
	var msg coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		r.fail(w, "protobuf: "+err.Error(), http.StatusBadRequest)
		return
	}
	var got []Span
	for _, rs := range msg.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				got = append(got, Span{
					Name: s.GetName(), TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentSpanID: hex.EncodeToString(s.GetParentSpanId()), Kind: s.GetKind(), TraceState: s.GetTraceState(),
					Attrs: attrs(s.GetAttributes()), Resource: res,
					Error: s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR, Status: s.GetStatus().GetMessage(),
					Scope: ss.GetScope().GetName(),
				})
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.requests++
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *Receiver) fail(w http.ResponseWriter, msg string, status int) {
	r.mu.Lock()
	r.bad = append(r.bad, msg)
	r.mu.Unlock()
	http.Error(w, msg, status)
}

// attrs flattens OTLP attributes to text.
func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = fmt.Sprint(x.IntValue)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = fmt.Sprint(x.BoolValue)
		case *commonpb.AnyValue_DoubleValue:
			m[kv.GetKey()] = fmt.Sprint(x.DoubleValue)
		default:
			m[kv.GetKey()] = v.String()
		}
	}
	return m
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Trace returns the received spans of one trace (hex id).
func (r *Receiver) Trace(traceID string) []Span {
	var out []Span
	for _, s := range r.Spans() {
		if s.TraceID == traceID {
			out = append(out, s)
		}
	}
	return out
}

// Bad returns what the receiver refused (a request it could not decode), for a test to
// report: an exporter that sends what a collector refuses is a failure.
func (r *Receiver) Bad() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bad...)
}

// WaitFor waits up to timeout until ok holds for the spans of traceID, and returns them.
func (r *Receiver) WaitFor(t testing.TB, traceID string, timeout time.Duration, ok func([]Span) bool) []Span {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		spans := r.Trace(traceID)
		if ok(spans) {
			return spans
		}
		if time.Now().After(deadline) {
			t.Fatalf("trace %s: the receiver did not get the spans in %s; got %s (refused: %v)", traceID, timeout, Names(spans), r.Bad())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Names lists spans' names, for failure messages.
func Names(spans []Span) string {
	var names []string
	for _, s := range spans {
		names = append(names, s.Name)
	}
	return "[" + strings.Join(names, ", ") + "]"
}
