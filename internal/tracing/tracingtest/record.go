package tracingtest

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"sandboxd/internal/tracing"
)

// Record installs, for the rest of the test, a global tracer provider that samples every
// trace and keeps its ended spans in memory (with sandboxd's span limits), and the W3C
// propagator; the no-op provider is back when the test ends. Tests that record must not run
// in parallel with others of their package that make spans.
func Record(t testing.TB) *tracetest.SpanRecorder {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithRawSpanLimits(tracing.Limits()))
	tracing.Install(tp)
	t.Cleanup(func() {
		tracing.Uninstall()
		_ = tp.Shutdown(context.Background())
	})
	return rec
}
