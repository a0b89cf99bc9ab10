package resolvers

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"sandboxd/internal/tracing"
)

// maxResolverSpans bounds the resolver spans of one operation: a query that lists many
// sandboxes with a resolved field each gets spans for the first ones and a count of the rest.
const maxResolverSpans = 64

// maxOperationName bounds the client-chosen operation name a span records.
const maxOperationName = 64

// GraphQL span attributes.
const (
	keyOperationType = attribute.Key("graphql.operation.type")
	keyOperationName = attribute.Key("graphql.operation.name")
)

// tracingExtension is the gqlgen extension (handler.Server.Use) that traces operations and
// resolvers: a span per operation ("graphql.query", "graphql.mutation", "graphql.subscription"; a
// subscription's lasts until its stream ends), and under it a span per resolved field
// ("Mutation.exec", "Query.sandbox"; fields without a resolver of their own get none),
// at most maxResolverSpans per operation. Errors are recorded by their extensions.code.
// NewHandler uses it first, so that its spans enclose the other extensions' work. Spans
// start on the global tracer provider (internal/tracing installs it), under the request's
// server span: without one (tracing off) an operation costs nothing more.
type tracingExtension struct{}

var (
	_ graphql.HandlerExtension     = tracingExtension{}
	_ graphql.OperationInterceptor = tracingExtension{}
	_ graphql.FieldInterceptor     = tracingExtension{}
)

// ExtensionName implements graphql.HandlerExtension.
func (tracingExtension) ExtensionName() string { return "Tracing" }

// Validate implements graphql.HandlerExtension.
func (tracingExtension) Validate(graphql.ExecutableSchema) error { return nil }

// opSpans is what an operation's context holds for its resolver spans.
type opSpans struct {
	started atomic.Int32
	dropped atomic.Int32
}

type opSpansKey struct{}

// InterceptOperation implements graphql.OperationInterceptor.
func (tracingExtension) InterceptOperation(ctx context.Context, next graphql.OperationHandler) graphql.ResponseHandler {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return next(ctx) // no request span: tracing is off
	}
	oc := graphql.GetOperationContext(ctx)
	kind, name := ast.Query, oc.OperationName
	if oc.Operation != nil {
		kind = oc.Operation.Operation
		if name == "" {
			name = oc.Operation.Name
		}
	}
	attrs := []attribute.KeyValue{keyOperationType.String(string(kind))}
	if name != "" && len(name) <= maxOperationName {
		attrs = append(attrs, keyOperationName.String(name)) // the parser allows only [_A-Za-z0-9]
	}
	ctx, span := otel.Tracer("sandboxd/graphql").Start(ctx, "graphql."+string(kind), trace.WithAttributes(attrs...))
	spans := &opSpans{}
	ctx = context.WithValue(ctx, opSpansKey{}, spans)
	var once sync.Once
	end := func() {
		once.Do(func() {
			if n := spans.dropped.Load(); n > 0 {
				span.SetAttributes(tracing.KeySpansLimit.Int(int(n)))
			}
			span.End()
		})
	}
	// The operation's context ends with its request, or with its WebSocket operation: a
	// stream that is never read to its end still ends its span.
	stop := context.AfterFunc(ctx, end)
	h := next(ctx)
	failed := false
	return func(ctx context.Context) *graphql.Response {
		resp := h(ctx)
		if resp == nil {
			stop()
			end()
			return nil
		}
		if len(resp.Errors) > 0 && !failed {
			failed = true
			tracing.Fail(span, errorCode(resp.Errors[0].Extensions))
		}
		if kind != ast.Subscription && (resp.HasNext == nil || !*resp.HasNext) {
			stop()
			end()
		}
		return resp
	}
}

// InterceptField implements graphql.FieldInterceptor.
func (tracingExtension) InterceptField(ctx context.Context, next graphql.Resolver) (any, error) {
	fc := graphql.GetFieldContext(ctx)
	spans, _ := ctx.Value(opSpansKey{}).(*opSpans)
	if fc == nil || !fc.IsResolver || spans == nil {
		return next(ctx)
	}
	if spans.started.Add(1) > maxResolverSpans {
		spans.dropped.Add(1)
		return next(ctx)
	}
	ctx, span := otel.Tracer("sandboxd/graphql").Start(ctx, fc.Object+"."+fc.Field.Name)
	defer span.End()
	res, err := next(ctx)
	if err != nil {
		tracing.Fail(span, tracing.CodeOf(err))
	}
	return res, err
}

// errorCode is a GraphQL error's extensions.code, or INTERNAL when it has none.
func errorCode(ext map[string]any) string {
	if c, ok := ext["code"].(string); ok && c != "" && len(c) <= 64 {
		return c
	}
	return "INTERNAL"
}
