package resolvers

import (
	"context"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"

	"sandboxd/internal/offstack"
)

// setUpSubscriptionsOffStack is the outermost operation middleware: a subscription over a
// WebSocket is set up (the other extensions, the key's rate limit in Redis, the resolver and
// the service behind it) on a goroutine that ends when the set-up does (offstack.Run). gqlgen's
// goroutine that then waits for the subscription's events lives as long as the subscription:
// set up there, each idle subscription kept a 16 KiB stack, where its waiting needs 4 KiB.
// A panic in the set-up reaches gqlgen's recover on its own goroutine.
func setUpSubscriptionsOffStack(ctx context.Context, next graphql.OperationHandler) graphql.ResponseHandler {
	oc := graphql.GetOperationContext(ctx)
	if ws, _ := ctx.Value(websocketKey{}).(bool); !ws || oc.Operation == nil || oc.Operation.Operation != ast.Subscription {
		return next(ctx)
	}
	return offstack.Run(func() graphql.ResponseHandler { return next(ctx) })
}
