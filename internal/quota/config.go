package quota

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"sandboxd/internal/auth"
)

// Config is the quota section of sandboxd's config.
type Config struct {
	// DefaultLimit is each tenant:project's concurrency limit (sandboxes CREATING,
	// STARTING or RUNNING); 0 means unlimited.
	DefaultLimit int `json:"default_limit"`
	// Limits overrides it per "tenant:project".
	Limits map[string]int `json:"limits"`
	// LeaseSec is a slot lease; the reconciler renews live ones.
	LeaseSec int `json:"lease_sec"`
	// RetryAfterSec is the Retry-After of a full project.
	RetryAfterSec int `json:"retry_after_sec"`
}

// DefaultConfig is the quota section when config says nothing: 10 slots per tenant:project,
// 60 s leases, Retry-After 5 s.
func DefaultConfig() Config {
	return Config{DefaultLimit: 10, LeaseSec: int(defaultLease / time.Second), RetryAfterSec: int(defaultRetryAfter / time.Second)}
}

// Validate reports every problem of c, each naming its setting.
func (c Config) Validate() error {
	var errs []error
	if c.DefaultLimit < 0 || c.LeaseSec <= 0 || c.RetryAfterSec <= 0 {
		errs = append(errs, errors.New("quota: default_limit must be >= 0, lease_sec and retry_after_sec > 0"))
	}
	for scope, n := range c.Limits {
		if t, p, ok := strings.Cut(scope, ":"); !ok || !auth.ValidID(t) || !auth.ValidID(p) || n < 0 {
			errs = append(errs, fmt.Errorf("quota.limits: %q must be tenant:project with a limit >= 0", scope))
		}
	}
	return errors.Join(errs...)
}

// Options are a Quota's options from c (the clock and the settle time take their defaults).
func (c Config) Options() Options {
	return Options{
		Limits:     Limits{Default: c.DefaultLimit, PerScope: c.Limits},
		Lease:      time.Duration(c.LeaseSec) * time.Second,
		RetryAfter: time.Duration(c.RetryAfterSec) * time.Second,
	}
}
