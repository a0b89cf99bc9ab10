package resolvers

import (
	"context"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/99designs/gqlgen/graphql/handler/lru"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/coder/websocket"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"sandboxd/graph"
	"sandboxd/internal/api"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// HandlerOptions configure NewHandler. Zero values take the defaults.
type HandlerOptions struct {
	// AllowedOrigins are the Origin hosts, besides the page's own, from which a browser may
	// open the WebSocket (coder/websocket OriginPatterns: path.Match patterns such as
	// "dashboard.example.com" or "*.example.com"). A foreign Origin gets 403. Clients that
	// send no Origin (non-browsers) are not affected.
	AllowedOrigins []string
	// KeepAlivePingInterval is how often an idle WebSocket (graphql-ws "ka", graphql-transport-ws
	// "ping") or SSE stream (": ping") gets a keepalive. Default 15s.
	KeepAlivePingInterval time.Duration
	// WriteTimeout bounds each write to a stream: a WebSocket message (keepalives included) or
	// an SSE event and its flush. A subscriber that stops reading is cut off when one write
	// misses it: its WebSocket closes, or its SSE response ends, and its subscriptions end.
	// Default 30s.
	WriteTimeout time.Duration
	// ComplexityLimit is the points budget of one operation (see cost.go for the prices).
	// Default DefaultCostLimit.
	ComplexityLimit int
	// MaxReadBytes bounds the bytes one operation may read into its answer (readFile's
	// maxBytes, exec output fields). Default DefaultMaxReadBytes.
	MaxReadBytes int64
	// MaxMutationFields bounds the mutation root fields of one operation. Default
	// DefaultMaxMutationFields.
	MaxMutationFields int
	// OutputFieldBytes is what one exec output field (stdout, stderr, their base64 forms) may
	// carry: the exec output cap. Default DefaultOutputFieldBytes.
	OutputFieldBytes int64
	// MaxLabels is the most labels a sandbox may have (limits.max_labels): the price of a
	// sandbox's labels as a list. Default sandbox.DefaultLimits().MaxLabels.
	MaxLabels int
	// MaxOperationsPerConnection bounds the operations (subscriptions, and queries and mutations
	// while they run) open at once on one WebSocket. Default DefaultMaxOperationsPerConnection.
	MaxOperationsPerConnection int
	// InitTimeout is how long a WebSocket may stay open without a connection_init before it
	// is closed with 4408. Default 10s.
	InitTimeout time.Duration
	// DisableIntrospection refuses __schema and __type (introspection is always keyed).
	DisableIntrospection bool
	// RateLimit charges one request to a principal's rate limit: nil, or a RATE_LIMITED error.
	// It is called for each HTTP request, each WebSocket connection and each operation sent
	// over a WebSocket. Nil: no rate limit.
	RateLimit func(context.Context, auth.Principal) error
	// MaxBodyBytes bounds an HTTP request body and one WebSocket message. Default 1 MiB.
	MaxBodyBytes int64
	// Logger receives internal errors (with their cause) and panics. Default slog.Default().
	Logger *slog.Logger
	// Shutdown, once done, ends every open stream: WebSockets close (1000 "terminated") and
	// SSE streams end with "event: complete", so that http.Server.Shutdown need not wait for
	// them. Clients resume with the last cursor. Nil: streams end only with their client.
	// A context, not a channel: each stream hooks its end on it (context.AfterFunc) with no
	// goroutine of its own waiting for it.
	Shutdown context.Context
}

// Defaults of HandlerOptions and fixed bounds.
const (
	DefaultKeepAlivePingInterval = 15 * time.Second
	DefaultWriteTimeout          = 30 * time.Second
	DefaultMaxBodyBytes          = 1 << 20
	// DefaultMaxOperationsPerConnection bounds the operations open on one WebSocket.
	DefaultMaxOperationsPerConnection = 100

	// maxQueryTokens bounds the size of a query document before it is parsed.
	maxQueryTokens = 10_000
	// wsInitTimeout is how long a WebSocket may stay open without a connection_init, by default.
	wsInitTimeout = 10 * time.Second
	// WebSocket close codes (graphql-transport-ws): a connection_init that did not
	// authenticate, or whose key is over its rate limit.
	wsAuthFailed  = 4403
	wsRateLimited = 4429
	// maxCloseReason is the longest close reason a WebSocket close frame carries.
	maxCloseReason = 123
)

// NewHandler returns the GraphQL endpoint; mount it at /graphql. It speaks
//   - SSE: POST with Accept: text/event-stream (subscriptions, also queries and mutations);
//   - WebSocket: graphql-transport-ws and legacy graphql-ws;
//   - GraphQL over HTTP (httptransport.go): POST application/json, GET for queries only,
//     answering application/json or application/graphql-response+json as the client accepts.
//
// Every request but a WebSocket upgrade needs a key (gate.go): HTTP requests authenticate with
// the X-Api-Key header (+ the optional X-Sandbox-Tenant-Id / X-Sandbox-Project-Id scope
// headers), are charged to the key's rate limit, and have their body bounded before anything
// parses it. A failure is answered before GraphQL runs, with the code's HTTP status (401
// UNAUTHENTICATED, 403 PERMISSION_DENIED, 400 INVALID_ARGUMENT, 413 PAYLOAD_TOO_LARGE, 429
// RATE_LIMITED with Retry-After) and a GraphQL error body without data:
// {"errors":[{"message":…,"extensions":{"code":…}}]}.
//
// Operations are priced before they run (cost.go) and refused over budget with COST_EXCEEDED;
// an answer carries its price in extensions.cost.
//
// WebSocket connections authenticate in connection_init: the payload carries "X-Api-Key"
// (or "x-api-key" or "apiKey") and the optional scope keys, at its top level or under
// "headers". A WebSocket upgrade that carries X-Api-Key as a header is authenticated by it
// (a bad key is rejected like any HTTP request) and needs no key in the payload. A failed
// connection_init closes the socket with code 4403 and the reason "CODE: message" (4429 when
// the key is over its rate limit); the protocol's other close codes are in wsconn.go.
func NewHandler(svc api.Service, authn *auth.Authenticator, opts HandlerOptions) http.Handler {
	if opts.KeepAlivePingInterval <= 0 {
		opts.KeepAlivePingInterval = DefaultKeepAlivePingInterval
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultWriteTimeout
	}
	if opts.ComplexityLimit <= 0 {
		opts.ComplexityLimit = DefaultCostLimit
	}
	if opts.MaxReadBytes <= 0 {
		opts.MaxReadBytes = DefaultMaxReadBytes
	}
	if opts.MaxMutationFields <= 0 {
		opts.MaxMutationFields = DefaultMaxMutationFields
	}
	if opts.OutputFieldBytes <= 0 {
		opts.OutputFieldBytes = DefaultOutputFieldBytes
	}
	if opts.MaxLabels <= 0 {
		opts.MaxLabels = sandbox.DefaultLimits().MaxLabels
	}
	if opts.InitTimeout <= 0 {
		opts.InitTimeout = wsInitTimeout
	}
	if opts.MaxOperationsPerConnection <= 0 {
		opts.MaxOperationsPerConnection = DefaultMaxOperationsPerConnection
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	errs := errorPolicy{log: opts.Logger}
	g := &gate{authn: authn, maxBody: opts.MaxBodyBytes, shutdown: opts.Shutdown, writeTimeout: opts.WriteTimeout,
		log: opts.Logger, limit: opts.RateLimit}

	srv := handler.New(graph.NewExecutableSchema(graph.Config{Resolvers: &Resolver{svc: svc}}))
	// Order matters: the first transport that supports a request serves it. SSE must come
	// before POST, which would otherwise answer a subscription with its first event only.
	srv.AddTransport(transport.SSE{KeepAlivePingInterval: opts.KeepAlivePingInterval})
	srv.AddTransport(transport.Websocket{
		Implementation: deadlineWebsocket{
			impl: coderWebsocket{
				acceptOptions: websocket.AcceptOptions{OriginPatterns: opts.AllowedOrigins},
				maxOps:        opts.MaxOperationsPerConnection,
				initTimeout:   opts.InitTimeout,
				// graphql-transport-ws: a ping every interval; a client that does not pong is
				// not cut off, the pings only keep proxies from closing idle sockets.
				// graphql-ws: a "ka" every interval.
				keepAlive:    opts.KeepAlivePingInterval,
				writeTimeout: opts.WriteTimeout,
			},
			timeout: opts.WriteTimeout,
			log:     opts.Logger,
		},
		InitFunc: g.websocketInit,
		// The connection closes itself with 4408 after InitTimeout (coderConn); gqlgen's own
		// timeout, which would close with 4400, is a backstop.
		InitTimeout: 2 * opts.InitTimeout,
		// Keepalives come from the connection (coderConn), not from gqlgen's goroutines:
		// KeepAlivePingInterval and PingPongInterval stay 0.
		MissingPongOk:    true,
		PayloadReadLimit: &opts.MaxBodyBytes,
	})
	srv.AddTransport(httpPOST{})
	srv.AddTransport(httpGET{})
	srv.AddTransport(transport.Options{})

	// Outermost: every other extension sees a response's real data (wsraw.go).
	srv.AroundResponses(stashData)
	srv.AroundOperations(setUpSubscriptionsOffStack) // outermost: the set-up's stack dies with it
	srv.Use(tracingExtension{})                      // first of the rest: its spans enclose the other extensions' work
	srv.SetQueryCache(lru.New[*ast.QueryDocument](1000))
	srv.SetParserTokenLimit(maxQueryTokens)
	if !opts.DisableIntrospection {
		srv.Use(extension.Introspection{})
	}
	srv.Use(&costBudget{points: int64(opts.ComplexityLimit), readBytes: opts.MaxReadBytes,
		mutations: opts.MaxMutationFields, fileBytes: maxReadFileBytes, outputBytes: opts.OutputFieldBytes,
		listDefaults: map[string]int64{"Query.sandboxes": 50, "Query.listFiles": 1000, "Query.snapshots": 50, "Query.execs": 50,
			"Query.agentRuns": 50, "Sandbox.labels": int64(opts.MaxLabels)}})
	srv.AroundOperations(g.chargeWebsocketOperations)
	srv.AroundOperations(refuseOneShotSubscriptions)
	srv.AroundFields(codeResolverErrors)
	srv.AroundResponses(withLoaders(svc))
	srv.AroundOperations(watchStreamEnds)
	srv.AroundResponses(reportStreamEnds)
	srv.SetErrorPresenter(errs.present)
	srv.SetRecoverFunc(errs.recover)

	return g.wrap(srv)
}

// refuseOneShotSubscriptions answers a subscription sent over plain POST or GET with an error:
// those transports would deliver only its first event, and only once one happens.
func refuseOneShotSubscriptions(ctx context.Context, next graphql.OperationHandler) graphql.ResponseHandler {
	oc := graphql.GetOperationContext(ctx)
	if oneShot, _ := ctx.Value(oneShotKey{}).(bool); oneShot && oc.Operation != nil && oc.Operation.Operation == ast.Subscription {
		e := apierror.New(apierror.InvalidArgument,
			"subscriptions need a WebSocket (graphql-transport-ws) or SSE (POST with Accept: text/event-stream)")
		return graphql.OneShot(&graphql.Response{Errors: gqlerror.List{gqlError(e)}})
	}
	return next(ctx)
}

// writeError answers an HTTP request that did not reach GraphQL with the code's status, a
// Retry-After when the error has one, and a body holding the one coded error and no "data"
// entry, in the media type the client accepts (application/json when it accepts neither, or
// asked for an event stream).
func writeError(w http.ResponseWriter, r *http.Request, e *apierror.Error) {
	mt, ok := negotiate(r.Header.Values("Accept"))
	if !ok {
		mt = mediaJSON
	}
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(e.RetryAfter.Seconds()))))
	}
	writeHTTPError(w, mt, e.Code.HTTPStatus(), e)
}
