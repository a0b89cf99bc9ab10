package resolvers

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/99designs/gqlgen/graphql/handler/lru"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/99designs/gqlgen/graphql/playground"
	"github.com/coder/websocket"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"sandboxd/graph"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
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
	// ComplexityLimit bounds the complexity of one operation (each field counts 1). Default 500.
	ComplexityLimit int
	// MaxBodyBytes bounds an HTTP request body and one WebSocket message. Default 1 MiB.
	MaxBodyBytes int64
	// Logger receives internal errors (with their cause) and panics. Default slog.Default().
	Logger *slog.Logger
	// Shutdown, when closed, ends every open stream: WebSockets close (1000 "terminated") and
	// SSE streams end with "event: complete", so that http.Server.Shutdown need not wait for
	// them. Clients resume with the last cursor. Nil: streams end only with their client.
	Shutdown <-chan struct{}
}

// Defaults of HandlerOptions and fixed bounds.
const (
	DefaultKeepAlivePingInterval = 15 * time.Second
	DefaultWriteTimeout          = 30 * time.Second
	DefaultComplexityLimit       = 500
	DefaultMaxBodyBytes          = 1 << 20

	// maxQueryTokens bounds the size of a query document before it is parsed.
	maxQueryTokens = 10_000
	// wsInitTimeout is how long a WebSocket may stay open without a connection_init.
	wsInitTimeout = 10 * time.Second
	// wsAuthFailed is the close code of a WebSocket whose connection_init did not authenticate.
	wsAuthFailed = 4403
	// maxCloseReason is the longest close reason a WebSocket close frame carries.
	maxCloseReason = 123
)

// NewHandler returns the GraphQL endpoint; mount it at /graphql. It speaks
//   - SSE: POST with Accept: text/event-stream (subscriptions, also queries and mutations);
//   - WebSocket: graphql-transport-ws and legacy graphql-ws;
//   - POST application/json; GET for queries only; OPTIONS.
//
// HTTP requests authenticate with the X-Api-Key header (+ the optional X-Sandbox-Tenant-Id /
// X-Sandbox-Project-Id scope headers). A failure is answered before GraphQL runs, with the
// code's HTTP status (401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 400 INVALID_ARGUMENT) and a
// GraphQL error body: {"errors":[{"message":…,"extensions":{"code":…}}],"data":null}.
//
// WebSocket connections authenticate in connection_init: the payload carries "X-Api-Key"
// (or "x-api-key" or "apiKey") and the optional scope keys, at its top level or under
// "headers". A WebSocket upgrade that carries X-Api-Key as a header is authenticated by it
// (a bad key is rejected like any HTTP request) and needs no key in the payload. A failed
// connection_init closes the socket with code 4403 and the reason "CODE: message".
func NewHandler(svc Service, authn *auth.Authenticator, opts HandlerOptions) http.Handler {
	if opts.KeepAlivePingInterval <= 0 {
		opts.KeepAlivePingInterval = DefaultKeepAlivePingInterval
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultWriteTimeout
	}
	if opts.ComplexityLimit <= 0 {
		opts.ComplexityLimit = DefaultComplexityLimit
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	errs := errorPolicy{log: opts.Logger}
	g := &gate{authn: authn, maxBody: opts.MaxBodyBytes, shutdown: opts.Shutdown, writeTimeout: opts.WriteTimeout,
		log: opts.Logger}

	srv := handler.New(graph.NewExecutableSchema(graph.Config{Resolvers: &Resolver{svc: svc}}))
	// Order matters: the first transport that supports a request serves it. SSE must come
	// before POST, which would otherwise answer a subscription with its first event only.
	srv.AddTransport(transport.SSE{KeepAlivePingInterval: opts.KeepAlivePingInterval})
	srv.AddTransport(transport.Websocket{
		Implementation: deadlineWebsocket{
			impl: coderWebsocket{
				acceptOptions: websocket.AcceptOptions{OriginPatterns: opts.AllowedOrigins},
			},
			timeout: opts.WriteTimeout,
			log:     opts.Logger,
		},
		InitFunc:              g.websocketInit,
		InitTimeout:           wsInitTimeout,
		KeepAlivePingInterval: opts.KeepAlivePingInterval,
		// graphql-transport-ws: ping every interval; a client that does not pong is not cut
		// off (MissingPongOk), the pings only keep proxies from closing idle sockets.
		PingPongInterval: opts.KeepAlivePingInterval,
		MissingPongOk:    true,
		PayloadReadLimit: &opts.MaxBodyBytes,
	})
	srv.AddTransport(transport.POST{})
	srv.AddTransport(transport.GET{})
	srv.AddTransport(transport.Options{})

	srv.SetQueryCache(lru.New[*ast.QueryDocument](1000))
	srv.SetParserTokenLimit(maxQueryTokens)
	srv.Use(extension.Introspection{})
	srv.Use(extension.FixedComplexityLimit(opts.ComplexityLimit))
	srv.AroundOperations(refuseOneShotSubscriptions)
	srv.AroundFields(codeResolverErrors)
	srv.SetErrorPresenter(errs.present)
	srv.SetRecoverFunc(errs.recover)

	return g.wrap(srv)
}

// GraphiQLHandler serves a GraphiQL page for /graphql (mount it at GET /graphiql). The page
// loads GraphiQL from a CDN; set the X-Api-Key header in its headers tab.
func GraphiQLHandler() http.Handler {
	return playground.Handler("sandboxd GraphQL", "/graphql",
		playground.WithGraphiqlUiHeaders(map[string]string{auth.HeaderAPIKey: ""}))
}

// gate authenticates requests and bounds their bodies before gqlgen sees them.
type gate struct {
	authn        *auth.Authenticator
	maxBody      int64
	shutdown     <-chan struct{}
	writeTimeout time.Duration
	log          *slog.Logger
}

type oneShotKey struct{}

func (g *gate) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodOptions || r.Method == http.MethodHead {
			next.ServeHTTP(w, r)
			return
		}
		upgrade := r.Header.Get("Upgrade") != ""
		sse := !upgrade && (transport.SSE{}).Supports(r)
		if upgrade || sse {
			// A stream ends with its request's context: on shutdown, and for SSE when a write
			// fails or misses its deadline (a WebSocket's writes are bounded by deadlineConn).
			ctx, cancel := context.WithCancel(r.Context())
			defer cancel()
			if g.shutdown != nil {
				go func() {
					select {
					case <-g.shutdown:
						cancel()
					case <-ctx.Done():
					}
				}()
			}
			r = r.WithContext(ctx)
			if sse {
				// An SSE stream outlives the server's WriteTimeout, as a WebSocket does (net/http
				// clears a hijacked connection's deadlines): each write sets its own deadline.
				sw := newSSEWriter(ctx, w, g.writeTimeout, cancel, g.log)
				defer sw.finish()
				w = sw
			}
		}
		key := r.Header.Get(auth.HeaderAPIKey)
		if upgrade && key == "" {
			next.ServeHTTP(w, r) // the WebSocket authenticates in connection_init
			return
		}
		p, err := g.authn.Authenticate(key, r.Header.Get(auth.HeaderTenant), r.Header.Get(auth.HeaderProject))
		if err != nil {
			writeError(w, apierror.From(err))
			return
		}
		ctx := auth.WithPrincipal(r.Context(), p)
		if !upgrade {
			if r.Body != nil && r.Body != http.NoBody {
				body, err := io.ReadAll(io.LimitReader(r.Body, g.maxBody+1))
				if err != nil {
					writeError(w, apierror.New(apierror.InvalidArgument, "could not read the request body"))
					return
				}
				if int64(len(body)) > g.maxBody {
					writeError(w, apierror.New(apierror.PayloadTooLarge, "the request body is larger than %d bytes", g.maxBody))
					return
				}
				// gqlgen answers a malformed body without a code and echoes the body back: refuse
				// it here with a code and a short message.
				if r.Method == http.MethodPost && len(bytes.TrimSpace(body)) > 0 && !json.Valid(body) {
					writeError(w, apierror.New(apierror.InvalidArgument, "the request body is not valid JSON"))
					return
				}
				r.Body = io.NopCloser(bytes.NewReader(body))
			}
			if !sse {
				ctx = context.WithValue(ctx, oneShotKey{}, true)
			}
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// websocketInit authenticates a WebSocket from its connection_init payload.
func (g *gate) websocketInit(ctx context.Context, payload transport.InitPayload) (context.Context, *transport.InitPayload, error) {
	key := initValue(payload, auth.HeaderAPIKey, "x-api-key", "apiKey")
	if key == "" {
		if _, ok := auth.FromContext(ctx); ok {
			return ctx, nil, nil // authenticated by the upgrade request's X-Api-Key header
		}
		return rejectWebsocket(ctx, apierror.New(apierror.Unauthenticated,
			"missing API key: send X-Api-Key in the connection_init payload"))
	}
	p, err := g.authn.Authenticate(key,
		initValue(payload, auth.HeaderTenant, "x-sandbox-tenant-id"),
		initValue(payload, auth.HeaderProject, "x-sandbox-project-id"))
	if err != nil {
		return rejectWebsocket(ctx, apierror.From(err))
	}
	return auth.WithPrincipal(ctx, p), nil, nil
}

func rejectWebsocket(ctx context.Context, e *apierror.Error) (context.Context, *transport.InitPayload, error) {
	ctx = transport.AppendCloseReason(transport.WithWebsocketCloseCode(ctx, wsAuthFailed), closeReason(e))
	return ctx, nil, &apierror.Error{Code: e.Code, Message: e.Message}
}

// closeReason is "CODE: message", cut to fit a close frame.
func closeReason(e *apierror.Error) string {
	reason := string(e.Code) + ": " + e.Message
	if len(reason) > maxCloseReason {
		cut := maxCloseReason
		for cut > 0 && !utf8.RuneStart(reason[cut]) {
			cut--
		}
		reason = reason[:cut]
	}
	return reason
}

// initValue returns the first non-empty string among names, at the payload's top level or
// under its "headers" object (as some clients send it).
func initValue(payload transport.InitPayload, names ...string) string {
	headers, _ := payload["headers"].(map[string]any)
	for _, m := range []map[string]any{payload, headers} {
		for _, n := range names {
			if s, _ := m[n].(string); s != "" {
				return s
			}
		}
	}
	return ""
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

// writeError answers an HTTP request that did not reach GraphQL with the code's status and a
// GraphQL error body.
func writeError(w http.ResponseWriter, e *apierror.Error) {
	b, _ := json.Marshal(graphql.Response{Errors: gqlerror.List{gqlError(e)}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Code.HTTPStatus())
	_, _ = w.Write(b)
}
