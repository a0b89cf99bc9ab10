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
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
)

// gate authenticates requests, charges them to their key's rate limit and bounds their bodies
// before gqlgen sees them. The one request that passes without a key is a WebSocket upgrade
// (GET with Upgrade: websocket): it authenticates in connection_init, before any operation.
// Every other request, whatever its headers, needs a key; gqlgen would serve any request that
// carries an Upgrade header as a WebSocket, so the gate removes that header from the others.
type gate struct {
	authn        *auth.Authenticator
	maxBody      int64
	shutdown     context.Context
	writeTimeout time.Duration
	log          *slog.Logger
	// limit charges one request to its principal's rate limit; nil means no rate limit.
	limit func(context.Context, auth.Principal) error
}

type (
	oneShotKey   struct{}
	websocketKey struct{}
)

func (g *gate) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodOptions {
			// A CORS preflight is answered before the gate; any other OPTIONS learns the methods
			// and nothing of the schema.
			w.Header().Set("Allow", "GET, POST, OPTIONS")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		ws := auth.IsWebSocketUpgrade(r)
		if !ws {
			r.Header.Del("Upgrade")
		}
		sse := !ws && (transport.SSE{}).Supports(r)
		if sse {
			// A stream ends with its request's context: on shutdown, and when a write fails or
			// misses its deadline (a WebSocket's writes are bounded by deadlineConn, and its
			// context ends as serveDetached says).
			ctx, cancel := context.WithCancel(r.Context())
			defer cancel()
			if g.shutdown != nil {
				stop := context.AfterFunc(g.shutdown, cancel)
				defer stop()
			}
			r = r.WithContext(ctx)
			// An SSE stream outlives the server's WriteTimeout, as a WebSocket does (net/http
			// clears a hijacked connection's deadlines): each write sets its own deadline.
			sw := newSSEWriter(ctx, w, g.writeTimeout, cancel, g.log)
			defer sw.finish()
			w = sw
		}
		key := r.Header.Get(auth.HeaderAPIKey)
		if ws {
			r = r.WithContext(withRawData(context.WithValue(r.Context(), websocketKey{}, true)))
			if key == "" {
				serveDetached(next, w, r, g.shutdown, g.log) // the WebSocket authenticates in connection_init
				return
			}
		}
		p, err := g.authn.Authenticate(key, r.Header.Get(auth.HeaderTenant), r.Header.Get(auth.HeaderProject))
		if err != nil {
			writeError(w, r, apierror.From(err))
			return
		}
		if err := g.charge(r.Context(), p); err != nil {
			writeError(w, r, err)
			return
		}
		ctx := auth.WithPrincipal(r.Context(), p)
		if !ws {
			if r.Body != nil && r.Body != http.NoBody {
				body, err := io.ReadAll(io.LimitReader(r.Body, g.maxBody+1))
				if err != nil {
					writeError(w, r, apierror.New(apierror.InvalidArgument, "could not read the request body"))
					return
				}
				if int64(len(body)) > g.maxBody {
					writeError(w, r, apierror.New(apierror.PayloadTooLarge, "the request body is larger than %d bytes", g.maxBody))
					return
				}
				// gqlgen answers a malformed body without a code and echoes the body back: refuse
				// it here with a code and a short message.
				if r.Method == http.MethodPost && len(bytes.TrimSpace(body)) > 0 && !json.Valid(body) {
					writeError(w, r, apierror.New(apierror.InvalidArgument, "the request body is not valid JSON"))
					return
				}
				r.Body = io.NopCloser(bytes.NewReader(body))
			}
			if !sse {
				ctx = context.WithValue(ctx, oneShotKey{}, true)
			}
		}
		if ws {
			serveDetached(next, w, r.WithContext(ctx), g.shutdown, g.log)
			return
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// charge spends one request of p's rate limit: nil, or a RATE_LIMITED error.
func (g *gate) charge(ctx context.Context, p auth.Principal) *apierror.Error {
	if g.limit == nil {
		return nil
	}
	if err := g.limit(ctx, p); err != nil {
		return apierror.From(err)
	}
	return nil
}

// websocketInit authenticates a WebSocket from its connection_init payload, and charges the
// connection to its key's rate limit.
func (g *gate) websocketInit(ctx context.Context, payload transport.InitPayload) (context.Context, *transport.InitPayload, error) {
	key := initValue(payload, auth.HeaderAPIKey, "x-api-key", "apiKey")
	if key == "" {
		if _, ok := auth.FromContext(ctx); ok {
			return ctx, nil, nil // authenticated (and charged) by the upgrade request's X-Api-Key header
		}
		return rejectWebsocket(ctx, wsAuthFailed, apierror.New(apierror.Unauthenticated,
			"missing API key: send X-Api-Key in the connection_init payload"))
	}
	p, err := g.authn.Authenticate(key,
		initValue(payload, auth.HeaderTenant, "x-sandbox-tenant-id"),
		initValue(payload, auth.HeaderProject, "x-sandbox-project-id"))
	if err != nil {
		return rejectWebsocket(ctx, wsAuthFailed, apierror.From(err))
	}
	if err := g.charge(ctx, p); err != nil {
		return rejectWebsocket(ctx, wsRateLimited, err)
	}
	return auth.WithPrincipal(ctx, p), nil, nil
}

// chargeWebsocketOperations is operation middleware: an operation sent over a WebSocket (a
// subscription when it is opened, or a query or mutation) spends one request of its key's
// rate limit, as an HTTP request does at the gate.
func (g *gate) chargeWebsocketOperations(ctx context.Context, next graphql.OperationHandler) graphql.ResponseHandler {
	if ws, _ := ctx.Value(websocketKey{}).(bool); ws && g.limit != nil {
		if p, ok := auth.FromContext(ctx); ok {
			if err := g.charge(ctx, p); err != nil {
				return graphql.OneShot(&graphql.Response{Errors: gqlerror.List{gqlError(err)}})
			}
		}
	}
	return next(ctx)
}

func rejectWebsocket(ctx context.Context, code int, e *apierror.Error) (context.Context, *transport.InitPayload, error) {
	ctx = transport.AppendCloseReason(transport.WithWebsocketCloseCode(ctx, code), closeReason(e))
	return ctx, nil, &apierror.Error{Code: e.Code, Message: e.Message}
}

// closeReason is "CODE: message", cut to fit a close frame.
func closeReason(e *apierror.Error) string {
	return cutUTF8(string(e.Code)+": "+e.Message, maxCloseReason)
}

// cutUTF8 cuts s to at most n bytes, at a character boundary.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
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
