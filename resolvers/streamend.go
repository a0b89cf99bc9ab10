package resolvers

import (
	"context"
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"sandboxd/internal/apierror"
)

// A subscription's stream ends in one of three ways: its last event (execOutput's EXIT,
// agentRunEvents' final STATUS, watchFiles' ERROR, a destroyed sandbox's last event), its
// client going away or the server shutting down, or the service's stream breaking off (its
// Redis failed again and again). The third never ends in a bare "complete": the stream's last
// message carries an error with extensions.code UNAVAILABLE and extensions.retryAfter, so a
// client knows to subscribe again with after set to the last cursor it saw.

// streamBrokeRetry is the retryAfter of a stream that broke off.
const streamBrokeRetry = 2 * time.Second

// streamEnd is where a subscription's resolver leaves the error its stream ended with, for
// the response middleware to send as the stream's last message.
type streamEnd struct {
	mu   sync.Mutex
	err  error
	path ast.Path
	sent bool
}

type streamEndKey struct{}

// watchStreamEnds is operation middleware: a subscription gets a place for its end's error.
func watchStreamEnds(ctx context.Context, next graphql.OperationHandler) graphql.ResponseHandler {
	oc := graphql.GetOperationContext(ctx)
	if oc.Operation == nil || oc.Operation.Operation != ast.Subscription {
		return next(ctx)
	}
	return next(context.WithValue(ctx, streamEndKey{}, &streamEnd{}))
}

// streamBroke records that the stream of the subscription resolved in ctx broke off. ctx is
// the resolver's: its field names the error's path.
func streamBroke(ctx context.Context) {
	end, ok := ctx.Value(streamEndKey{}).(*streamEnd)
	if !ok {
		return
	}
	var path ast.Path
	if fc := graphql.GetFieldContext(ctx); fc != nil {
		path = fc.Path()
	}
	end.mu.Lock()
	defer end.mu.Unlock()
	if end.err == nil {
		end.err = apierror.New(apierror.Unavailable,
			"the stream broke off (its store is unavailable); subscribe again with after set to the last cursor seen").
			WithRetryAfter(streamBrokeRetry)
		end.path = path
	}
}

// reportStreamEnds is response middleware: when a subscription's stream has ended and its
// resolver recorded an error, the last response carries that error (once), then the stream
// completes.
func reportStreamEnds(ctx context.Context, next graphql.ResponseHandler) *graphql.Response {
	resp := next(ctx)
	if resp != nil {
		return resp
	}
	end, ok := ctx.Value(streamEndKey{}).(*streamEnd)
	if !ok || ctx.Err() != nil {
		return nil
	}
	end.mu.Lock()
	err, path, sent := end.err, end.path, end.sent
	end.sent = true
	end.mu.Unlock()
	if err == nil || sent {
		return nil
	}
	graphql.AddError(ctx, &gqlerror.Error{Err: err, Message: err.Error(), Path: path})
	return &graphql.Response{Errors: graphql.GetErrors(ctx)}
}
