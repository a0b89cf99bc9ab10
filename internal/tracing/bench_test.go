package tracing_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"sandboxd/internal/tracing"
)

// What a request's server span costs: tracing off (the no-op provider, nothing parsed), and
// on with every trace sampled (the SDK; the export, batched elsewhere, is not measured).
func BenchmarkServerSpan(b *testing.B) {
	r := httptest.NewRequest(http.MethodPost, "/sandbox/sandboxes/v1/sbx_01HZZZZZZZZZZZZZZZZZZZZZZZ/exec", nil)
	r.Header.Set("traceparent", traceparent)
	run := func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, end := tracing.StartServer(r)
			end("/sandbox/sandboxes/v1/{id}/exec", 200)
		}
	}
	b.Run("off", run)
	b.Run("on", func(b *testing.B) {
		tracing.Install(sdktrace.NewTracerProvider(sdktrace.WithRawSpanLimits(tracing.Limits())))
		defer tracing.Uninstall()
		run(b)
	})
}
