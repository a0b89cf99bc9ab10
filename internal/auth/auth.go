// Package auth turns an X-Api-Key into a Principal: the tenant:project a caller acts as. Keys
// come from a config file (stored as SHA-256 hashes) or, for one development principal, from
// SANDBOX_API_KEY. Presented keys are compared in constant time against every known hash.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"

	"sandboxd/internal/apierror"
)

// Principal is the authenticated caller and the tenant:project it acts for.
type Principal struct {
	// Key is the name of the API key used (for logs; never the key itself).
	Key     string
	Tenant  string
	Project string
	// Platform keys may act for another tenant:project with the scope headers.
	Platform bool
}

// Scope is "tenant:project".
func (p Principal) Scope() string { return p.Tenant + ":" + p.Project }

// Key is one configured API key.
type Key struct {
	// Name identifies the key in logs.
	Name string `json:"name"`
	// SHA256 is the hex SHA-256 of the key. Use `sandboxd hash-key` to make one.
	SHA256   string `json:"sha256"`
	Tenant   string `json:"tenant"`
	Project  string `json:"project"`
	Platform bool   `json:"platform,omitempty"`
}

// Headers a platform key uses to act for a tenant:project.
const (
	HeaderAPIKey  = "X-Api-Key"
	HeaderTenant  = "X-Sandbox-Tenant-Id"
	HeaderProject = "X-Sandbox-Project-Id"
)

var idPattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// ValidID reports whether s is usable as a tenant or project id.
func ValidID(s string) bool { return idPattern.MatchString(s) }

type entry struct {
	key  Key
	hash [sha256.Size]byte
}

// Authenticator checks API keys.
type Authenticator struct {
	entries []entry
}

// HashKey returns the hex SHA-256 of an API key, the form keys are configured in.
func HashKey(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

// New builds an Authenticator from configured keys.
func New(keys []Key) (*Authenticator, error) {
	a := &Authenticator{}
	seen := map[string]bool{}
	for i, k := range keys {
		raw, err := hex.DecodeString(strings.ToLower(k.SHA256))
		if err != nil || len(raw) != sha256.Size {
			return nil, fmt.Errorf("api key %d (%q): sha256 must be 64 hex digits", i, k.Name)
		}
		if !ValidID(k.Tenant) || !ValidID(k.Project) {
			return nil, fmt.Errorf("api key %d (%q): tenant and project must match %s", i, k.Name, idPattern)
		}
		if seen[string(raw)] {
			return nil, fmt.Errorf("api key %d (%q): the same key is configured twice", i, k.Name)
		}
		seen[string(raw)] = true
		var e entry
		e.key = k
		copy(e.hash[:], raw)
		a.entries = append(a.entries, e)
	}
	return a, nil
}

// Len is the number of configured keys.
func (a *Authenticator) Len() int { return len(a.entries) }

// Authenticate resolves an API key and the optional scope headers to a Principal.
// A missing or unknown key is UNAUTHENTICATED; scope headers from a non-platform key are
// PERMISSION_DENIED; a platform key must send both headers or neither.
func (a *Authenticator) Authenticate(apiKey, tenant, project string) (Principal, error) {
	if apiKey == "" {
		return Principal{}, apierror.New(apierror.Unauthenticated, "missing API key: send it in the %s header", HeaderAPIKey)
	}
	h := sha256.Sum256([]byte(apiKey))
	var found *Key
	// Look at every entry so that timing does not tell which key matched.
	for i := range a.entries {
		if subtle.ConstantTimeCompare(h[:], a.entries[i].hash[:]) == 1 {
			found = &a.entries[i].key
		}
	}
	if found == nil {
		return Principal{}, apierror.New(apierror.Unauthenticated, "unknown API key")
	}
	p := Principal{Key: found.Name, Tenant: found.Tenant, Project: found.Project, Platform: found.Platform}
	if tenant == "" && project == "" {
		return p, nil
	}
	if !found.Platform {
		return Principal{}, apierror.New(apierror.PermissionDenied,
			"this API key may not act for another project: %s and %s are for platform keys only", HeaderTenant, HeaderProject)
	}
	if tenant == "" || project == "" {
		return Principal{}, apierror.New(apierror.InvalidArgument, "send both %s and %s, or neither", HeaderTenant, HeaderProject)
	}
	if !ValidID(tenant) || !ValidID(project) {
		return Principal{}, apierror.New(apierror.InvalidArgument, "%s and %s must match %s", HeaderTenant, HeaderProject, idPattern)
	}
	p.Tenant, p.Project = tenant, project
	return p, nil
}

type ctxKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// FromContext returns the principal in ctx, if any.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(ctxKey{}).(Principal)
	return p, ok
}

// Require returns the principal in ctx or an UNAUTHENTICATED error.
func Require(ctx context.Context) (Principal, error) {
	p, ok := FromContext(ctx)
	if !ok {
		return Principal{}, apierror.New(apierror.Unauthenticated, "missing API key: send it in the %s header", HeaderAPIKey)
	}
	return p, nil
}
