// Package tracing is sandboxd's OpenTelemetry tracing: the tracer provider and its OTLP/HTTP
// exporter (off unless configured), the W3C traceparent propagator, and the spans of the
// layers that have no tracing of their own: HTTP server spans (http.go), runtime driver calls
// (driver.go) and Redis scripts (redis.go). The GraphQL operation and resolver spans are
// resolvers' (a gqlgen extension); guest/client and internal/checkpoint start their own
// spans on the global provider, with this package's attribute keys.
//
// Spans carry the sandbox and exec ids, the HTTP route and status, and error codes; never a
// tenant or project, a key, a command line, a path inside a workspace or an error's message.
package tracing

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"sandboxd/internal/apierror"
)

// Attribute keys of sandboxd's own span attributes.
const (
	KeySandboxID  = attribute.Key("sandboxd.sandbox.id")
	KeyExecID     = attribute.Key("sandboxd.exec.id")
	KeyErrorCode  = attribute.Key("sandboxd.error.code")
	KeyRuntime    = attribute.Key("sandboxd.runtime")
	KeySpansLimit = attribute.Key("sandboxd.graphql.resolver_spans_dropped")
)

// Bounds of what one span holds, whatever a client sends: strings are cut at
// maxAttributeLength bytes, a span keeps at most 32 attributes and 16 events.
const (
	maxAttributeLength = 256
	// exportTimeout bounds one export to the collector.
	exportTimeout = 10 * time.Second
	// maxQueuedSpans bounds the ended spans waiting for export; beyond it new ones are dropped.
	maxQueuedSpans = 4096
)

// Options are what Setup needs besides the config.
type Options struct {
	// Version is the service.version of the spans ("" leaves it out).
	Version string
	// Logger gets a line when tracing is on, and the exporter's errors, at most one a
	// minute. Default slog.Default().
	Logger *slog.Logger
}

// Setup installs the tracer provider that c configures as the global one, with the W3C
// traceparent propagator, and returns what flushes and stops it at shutdown. With tracing off
// it installs nothing: the global provider stays OpenTelemetry's no-op, and incoming
// traceparents are not even parsed.
func Setup(ctx context.Context, c Config, o Options) (shutdown func(context.Context) error, err error) {
	if !c.On() {
		return func(context.Context) error { return nil }, nil
	}
	opts, err := c.exporterOptions()
	if err != nil {
		return nil, err
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, err
	}
	attrs := []attribute.KeyValue{semconv.ServiceName(c.ServiceName)}
	if o.Version != "" {
		attrs = append(attrs, semconv.ServiceVersion(o.Version))
	}
	if h, err := os.Hostname(); err == nil {
		attrs = append(attrs, semconv.HostName(h))
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	otel.SetErrorHandler(&errorLog{log: log, every: time.Minute})
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithResource(resource.NewWithAttributes(semconv.SchemaURL, attrs...)),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SampleRatio))),
		sdktrace.WithBatcher(exp, sdktrace.WithMaxQueueSize(maxQueuedSpans), sdktrace.WithExportTimeout(exportTimeout)),
		sdktrace.WithRawSpanLimits(Limits()),
	)
	Install(tp)
	log.Info("tracing: exporting spans over OTLP/HTTP", "endpoint", c.Endpoint, "sample_ratio", c.SampleRatio, "service_name", c.ServiceName)
	return tp.Shutdown, nil
}

// Limits are the span limits of sandboxd's tracer provider (tests use them too).
func Limits() sdktrace.SpanLimits {
	l := sdktrace.NewSpanLimits()
	l.AttributeValueLengthLimit = maxAttributeLength
	l.AttributeCountLimit = 32
	l.EventCountLimit = 16
	l.LinkCountLimit = 4
	l.AttributePerEventCountLimit = 8
	l.AttributePerLinkCountLimit = 8
	return l
}

// Install makes tp the global tracer provider, with the W3C traceparent propagator (no
// baggage: nothing a client sends is carried on besides the trace context), and turns the
// server spans on.
func Install(tp trace.TracerProvider) {
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	installed.Store(true)
}

// Uninstall undoes Install: the no-op provider and propagator, no server spans (tests).
func Uninstall() {
	installed.Store(false)
	otel.SetTracerProvider(noop.NewTracerProvider())
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())
}

// installed reports whether a tracer provider was installed: until then a request costs
// nothing (StartServer hands it on untouched).
var installed atomic.Bool

// tracer is the named tracer of a layer, from the global provider as it is now (a test may
// install another one).
func tracer(name string) trace.Tracer { return otel.Tracer(name) }

// startChild starts a span of a layer under ctx's span, and none when ctx is in no trace:
// the background loops (the exec followers, the reconciler) do not start traces of their own
// with every driver call or Redis script they make.
func startChild(ctx context.Context, scope, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, trace.SpanFromContext(ctx)
	}
	return tracer(scope).Start(ctx, name, opts...)
}

// Fail marks span failed with err's code (an apierror code, or one of the layer's own):
// the code is the span's status description and its sandboxd.error.code. The error's message
// is not recorded: it may name a tenant or a path.
func Fail(span trace.Span, code string) {
	span.SetStatus(codes.Error, code)
	span.SetAttributes(KeyErrorCode.String(code))
}

// SetErrorCode notes on ctx's span the code a request was answered with (REST error bodies
// call it): an attribute, not a failed status, since most codes are the caller's error.
func SetErrorCode(ctx context.Context, code string) {
	trace.SpanFromContext(ctx).SetAttributes(KeyErrorCode.String(code))
}

// CodeOf is err's code for a span: the context's errors by name, anything else by the
// apierror table (an uncoded error is INTERNAL, or UNAVAILABLE for a network error).
func CodeOf(err error) string {
	switch {
	case errors.Is(err, context.Canceled):
		return "CANCELED"
	case errors.Is(err, context.DeadlineExceeded):
		return "DEADLINE_EXCEEDED"
	}
	return string(apierror.CodeOf(err))
}

// errorLog logs OpenTelemetry's errors (an unreachable collector, a full queue) at most
// once per interval, so that a collector that is down does not flood the log.
type errorLog struct {
	log   *slog.Logger
	every time.Duration

	mu      sync.Mutex
	last    time.Time
	dropped int
}

func (e *errorLog) Handle(err error) {
	e.mu.Lock()
	now := time.Now()
	if now.Sub(e.last) < e.every {
		e.dropped++
		e.mu.Unlock()
		return
	}
	dropped := e.dropped
	e.last, e.dropped = now, 0
	e.mu.Unlock()
	e.log.Warn("tracing: exporting spans failed", "err", err, "errors_since_last_log", dropped)
}
