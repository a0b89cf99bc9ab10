package resolvers

import (
	"errors"
	"time"
)

// Config is the graphql section of sandboxd's config.
type Config struct {
	// AllowedOrigins are the Origin host patterns ("dashboard.example.com", "*.example.com")
	// whose pages may call the API from a browser, besides the server's own host: the
	// GraphQL WebSocket's and the REST terminal WebSocket's Origin check, and CORS for
	// /graphql and the REST paths.
	AllowedOrigins []string `json:"allowed_origins"`
	// KeepAliveSec is how often an idle stream gets a keepalive (default 15; 0 or less takes
	// the default).
	KeepAliveSec int `json:"keepalive_sec"`
	// ComplexityLimit is the points budget of one operation (default 10,000); see the
	// README's "Limits" for the prices.
	ComplexityLimit int `json:"complexity_limit"`
	// MaxReadBytes bounds the bytes one operation may read into its answer: readFile's
	// maxBytes and exec output fields, counted before it runs (default 16 MiB).
	MaxReadBytes int64 `json:"max_read_bytes"`
	// MaxMutationFields bounds the mutation fields of one operation (default 10).
	MaxMutationFields int `json:"max_mutation_fields"`
	// MaxOperationsPerConnection bounds the operations open at once on one WebSocket
	// (default 100).
	MaxOperationsPerConnection int `json:"max_operations_per_connection"`
	// Introspection answers __schema and __type to callers with a key (default true).
	Introspection *bool `json:"introspection"`
}

// DefaultConfig is the section when config says nothing: HandlerOptions' defaults.
func DefaultConfig() Config {
	return Config{KeepAliveSec: int(DefaultKeepAlivePingInterval / time.Second), ComplexityLimit: DefaultCostLimit,
		MaxReadBytes: DefaultMaxReadBytes, MaxMutationFields: DefaultMaxMutationFields,
		MaxOperationsPerConnection: DefaultMaxOperationsPerConnection}
}

// Validate reports the problems of c, naming the settings.
func (c Config) Validate() error {
	if c.ComplexityLimit < 1 || c.MaxReadBytes < 1 || c.MaxMutationFields < 1 || c.MaxOperationsPerConnection < 1 {
		return errors.New("graphql: complexity_limit, max_read_bytes, max_mutation_fields and max_operations_per_connection must be at least 1")
	}
	return nil
}

// HandlerOptions are NewHandler's options from c. The caller adds what is not this section's:
// OutputFieldBytes (the exec output cap), the rate limit, the logger and the shutdown channel.
func (c Config) HandlerOptions() HandlerOptions {
	return HandlerOptions{
		AllowedOrigins:             c.AllowedOrigins,
		KeepAlivePingInterval:      time.Duration(c.KeepAliveSec) * time.Second,
		ComplexityLimit:            c.ComplexityLimit,
		MaxReadBytes:               c.MaxReadBytes,
		MaxMutationFields:          c.MaxMutationFields,
		MaxOperationsPerConnection: c.MaxOperationsPerConnection,
		DisableIntrospection:       c.Introspection != nil && !*c.Introspection,
	}
}
