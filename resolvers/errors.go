package resolvers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"sandboxd/internal/apierror"
)

// How errors reach clients:
//   - a resolver's *apierror.Error: its public Message, extensions.code = its Code,
//     extensions.retryAfter = whole seconds (when set) and its Details as further extensions;
//   - any other resolver error and every panic: "internal error", code INTERNAL; the cause
//     is logged, never sent;
//   - gqlgen's own errors (parse, validation, complexity, coercion of arguments) keep their
//     message and code (GRAPHQL_PARSE_FAILED, GRAPHQL_VALIDATION_FAILED,
//     COMPLEXITY_LIMIT_EXCEEDED); argument coercion errors without a code get INVALID_ARGUMENT.

// maxErrorMessage bounds the message of gqlgen's own errors, which may quote a token of the
// request (a parse error quotes the unexpected one, which may be a 1 MiB string): an error
// never echoes the input back at length.
const maxErrorMessage = 256

// errorPolicy presents errors and recovers panics for one handler.
type errorPolicy struct {
	log *slog.Logger
}

// codeResolverErrors is field middleware: a resolver error without a code becomes INTERNAL, so
// that the presenter can tell a resolver's uncoded error (hidden) from gqlgen's own argument
// errors (shown).
func codeResolverErrors(ctx context.Context, next graphql.Resolver) (any, error) {
	res, err := next(ctx)
	if err != nil {
		if _, ok := errors.AsType[*apierror.Error](err); !ok {
			err = apierror.From(err)
		}
	}
	return res, err
}

// present is the gqlgen ErrorPresenter.
func (p errorPolicy) present(ctx context.Context, err error) *gqlerror.Error {
	gqlErr, ok := errors.AsType[*gqlerror.Error](err)
	if !ok {
		gqlErr = gqlerror.WrapPath(graphql.GetPath(ctx), err)
	}
	ae, ok := errors.AsType[*apierror.Error](err)
	if !ok {
		if len(gqlErr.Message) > maxErrorMessage {
			gqlErr.Message = cutUTF8(gqlErr.Message, maxErrorMessage) + "…"
		}
		if gqlErr.Err != nil && gqlErr.Extensions["code"] == nil {
			if gqlErr.Extensions == nil {
				gqlErr.Extensions = map[string]any{}
			}
			gqlErr.Extensions["code"] = string(apierror.InvalidArgument)
		}
		return gqlErr
	}
	out := &gqlerror.Error{Err: err, Message: ae.Message, Path: gqlErr.Path, Locations: gqlErr.Locations,
		Extensions: extensions(ae)}
	if ae.Code == apierror.Internal {
		if out.Message == "" {
			out.Message = "internal error"
		}
		if ae.Err != nil {
			p.log.ErrorContext(ctx, "graphql: internal error", "operation", operationName(ctx),
				"path", gqlErr.Path.String(), "err", ae.Err)
		}
	}
	return out
}

// extensions are an error's public details plus its code and retryAfter (which details cannot
// override).
func extensions(e *apierror.Error) map[string]any {
	ext := make(map[string]any, len(e.Details)+2)
	for k, v := range e.Details {
		ext[k] = v
	}
	ext["code"] = string(e.Code)
	if e.RetryAfter > 0 {
		ext["retryAfter"] = int(math.Ceil(e.RetryAfter.Seconds()))
	} else {
		delete(ext, "retryAfter")
	}
	return ext
}

// recover is the gqlgen RecoverFunc: log the panic with its stack, answer internal error.
func (p errorPolicy) recover(ctx context.Context, v any) error {
	p.log.ErrorContext(ctx, "graphql: panic", "operation", operationName(ctx),
		"path", graphql.GetPath(ctx).String(), "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
	return &apierror.Error{Code: apierror.Internal, Message: "internal error"}
}

func operationName(ctx context.Context) string {
	if !graphql.HasOperationContext(ctx) {
		return ""
	}
	return graphql.GetOperationContext(ctx).OperationName
}

// gqlError is a coded GraphQL error for responses written outside gqlgen (auth, body limit).
func gqlError(e *apierror.Error) *gqlerror.Error {
	return &gqlerror.Error{Message: e.Message, Extensions: extensions(e)}
}
