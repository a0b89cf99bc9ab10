package checkpoint

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"sandboxd/internal/apierror"
)

// The spans of checkpoint I/O, made inside a trace only: "checkpoint.save" (claim, compress,
// upload, manifest), "checkpoint.restore" (from Open until its stream's end or Close, the
// bytes a restore reads) and "checkpoint.verify", with the sandbox's and the checkpoint's
// ids and sizes. Errors are recorded by code (CORRUPT, CONFLICT, NOT_FOUND, …), never by
// message: messages name the tenant's objects. Attribute keys are those of internal/tracing.
const (
	tracerName       = "sandboxd/internal/checkpoint"
	keySandboxID     = attribute.Key("sandboxd.sandbox.id")
	keyCheckpointID  = attribute.Key("sandboxd.checkpoint.id")
	keyBytes         = attribute.Key("sandboxd.checkpoint.bytes")
	keyRawBytes      = attribute.Key("sandboxd.checkpoint.raw_bytes")
	keyErrorCode     = attribute.Key("sandboxd.error.code")
	maxTracedIDBytes = 96
)

// startSpan starts the span of one checkpoint operation on sc's sandbox, when ctx is in a trace.
func startSpan(ctx context.Context, name string, sc Scope, id string) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, trace.SpanFromContext(ctx)
	}
	var attrs []attribute.KeyValue
	if sc.Sandbox != "" && len(sc.Sandbox) <= maxTracedIDBytes {
		attrs = append(attrs, keySandboxID.String(sc.Sandbox))
	}
	if id != "" && len(id) <= maxTracedIDBytes {
		attrs = append(attrs, keyCheckpointID.String(id))
	}
	return otel.Tracer(tracerName).Start(ctx, name, trace.WithAttributes(attrs...))
}

// endSpan ends span with m's sizes (when err is nil) or err's code.
func endSpan(span trace.Span, m Manifest, err error) {
	if err != nil {
		code := errorCode(err)
		span.SetStatus(codes.Error, code)
		span.SetAttributes(keyErrorCode.String(code))
	} else if m.ID != "" {
		span.SetAttributes(keyCheckpointID.String(m.ID), keyBytes.Int64(m.Size), keyRawBytes.Int64(m.RawSize))
	}
	span.End()
}

// errorCode is the code of a Store error for its span.
func errorCode(err error) string {
	switch {
	case errors.Is(err, ErrCorrupt):
		return "CORRUPT"
	case errors.Is(err, ErrConflict):
		return "CONFLICT"
	case errors.Is(err, ErrNotFound):
		return "NOT_FOUND"
	case errors.Is(err, ErrInvalidID), errors.Is(err, ErrInvalidScope):
		return "INVALID_ARGUMENT"
	case errors.Is(err, context.Canceled):
		return "CANCELED"
	case errors.Is(err, context.DeadlineExceeded):
		return "DEADLINE_EXCEEDED"
	}
	return string(apierror.CodeOf(err))
}
