// Package resolvers is the GraphQL skin over internal/sandbox: thin resolvers (principal,
// arguments, one service call, conversion), the HTTP handler with its transports (POST, GET,
// SSE, WebSocket) and the mapping of coded errors to extensions.code.
package resolvers

//go:generate go tool gqlgen generate

import "sandboxd/internal/api"

// Resolver is the root resolver: the service every resolver calls.
type Resolver struct {
	svc api.Service
}
