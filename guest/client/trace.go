package client

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"sandboxd/guest/proto"
)

// The spans of guest calls: one per call made inside a trace ("guest POST /v1/execs"), named
// by the call's route (an exec or watch id in the path is "{id}"), with the exec's id; a
// call whose answer streams (an exec's log, the workspace's tar, a file) ends its span when
// the stream ends or is closed. No trace context travels to the guest: nothing inside a
// sandbox learns the control plane's trace ids. Attribute keys are those of
// internal/tracing.
const (
	tracerName   = "sandboxd/guest/client"
	keyExecID    = attribute.Key("sandboxd.exec.id")
	keyErrorCode = attribute.Key("sandboxd.error.code")
	keyRoute     = attribute.Key("url.template")
	keyMethod    = attribute.Key("http.request.method")
	keyStatus    = attribute.Key("http.response.status_code")
	keyBytes     = attribute.Key("sandboxd.guest.response_bytes")
)

// execIDKey carries to do the id of the exec a call starts (its id is in the body).
type execIDKey struct{}

func withExecID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, execIDKey{}, id)
}

// startCall starts the span of one call, when ctx is in a trace.
func startCall(ctx context.Context, method, p string) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, trace.SpanFromContext(ctx)
	}
	route, execID := routeOf(p)
	if execID == "" {
		execID, _ = ctx.Value(execIDKey{}).(string)
	}
	attrs := []attribute.KeyValue{keyMethod.String(method), keyRoute.String(route)}
	if execID != "" && len(execID) <= 64 {
		attrs = append(attrs, keyExecID.String(execID))
	}
	return otel.Tracer(tracerName).Start(ctx, "guest "+method+" "+route,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// routeOf is p with the id after /v1/execs/ or /v1/watches/ as "{id}", and the exec's id.
func routeOf(p string) (route, execID string) {
	segs := strings.Split(p, "/") // "", "v1", "execs", id, …
	if len(segs) >= 4 && segs[1] == "v1" && (segs[2] == "execs" || segs[2] == "watches") {
		if segs[2] == "execs" {
			execID = segs[3]
		}
		segs[3] = "{id}"
	}
	return strings.Join(segs, "/"), execID
}

// endCall ends a call's span with err's code.
func endCall(span trace.Span, err error) {
	if err != nil {
		code := callCode(err)
		span.SetStatus(codes.Error, code)
		span.SetAttributes(keyErrorCode.String(code))
	}
	span.End()
}

// callCode is a guest call's error code: the guest's own (one of the protocol's, upper-cased:
// a code that is not one is INTERNAL, since the guest runs inside the sandbox), CLOSED for a
// broken attach, the context's.
func callCode(err error) string {
	var pe *proto.Error
	switch {
	case errors.As(err, &pe):
		if len(pe.Code) > 0 && len(pe.Code) <= 32 && !strings.ContainsFunc(pe.Code, func(r rune) bool { return (r < 'a' || r > 'z') && r != '_' }) {
			return strings.ToUpper(pe.Code)
		}
		return "INTERNAL"
	case errors.Is(err, ErrClosed):
		return "CLOSED"
	case errors.Is(err, context.Canceled):
		return "CANCELED"
	case errors.Is(err, context.DeadlineExceeded):
		return "DEADLINE_EXCEEDED"
	}
	return "INTERNAL"
}

// spanBody is an answer's body that ends its call's span at its end or when it is closed,
// with the bytes read.
type spanBody struct {
	rc   io.ReadCloser
	ctx  context.Context
	c    *Client
	span trace.Span
	n    atomic.Int64
	once sync.Once
}

func (b *spanBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.n.Add(int64(n))
	if err != nil {
		if err == io.EOF {
			b.end(nil)
		} else {
			b.end(b.c.wrapErr(b.ctx, err))
		}
	}
	return n, err
}

func (b *spanBody) Close() error {
	b.end(nil)
	return b.rc.Close()
}

func (b *spanBody) end(err error) {
	b.once.Do(func() {
		b.span.SetAttributes(keyBytes.Int64(b.n.Load()))
		endCall(b.span, err)
	})
}
