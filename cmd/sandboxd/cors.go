package main

import (
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/rs/cors"

	"sandboxd/internal/auth"
)

// corsFor answers CORS for /graphql and the REST paths from the same Origin patterns the
// GraphQL WebSocket checks (graphql.allowed_origins: host patterns such as
// "dashboard.example.com" or "*.example.com", matched as path.Match against the Origin's host,
// as coder/websocket does). Browsers get:
//   - preflights answered for the API's methods, allowing X-Api-Key, the scope headers and
//     Content-Type;
//   - Retry-After readable by scripts;
//   - never credentials: keys travel in X-Api-Key, not cookies, so a wildcard pattern never
//     combines with Access-Control-Allow-Credentials.
//
// A request from an Origin not on the list gets no CORS headers (its preflight is answered
// without them), so the browser refuses it. With no patterns, no cross-origin page may call.
func corsFor(patterns []string) func(http.Handler) http.Handler {
	c := cors.New(cors.Options{
		AllowOriginFunc: func(origin string) bool { return originAllowed(patterns, origin) },
		AllowedMethods:  []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete},
		AllowedHeaders: []string{auth.HeaderAPIKey, auth.HeaderTenant, auth.HeaderProject, "Content-Type", "Accept",
			"Last-Event-ID"},
		ExposedHeaders:   []string{"Retry-After", "Content-Length", "Content-Disposition"},
		AllowCredentials: false,
		MaxAge:           600,
	})
	return c.Handler
}

// originAllowed reports whether origin's host matches one of patterns.
func originAllowed(patterns []string, origin string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	host := strings.ToLower(u.Host)
	for _, p := range patterns {
		if ok, err := path.Match(strings.ToLower(p), host); err == nil && ok {
			return true
		}
	}
	return false
}
