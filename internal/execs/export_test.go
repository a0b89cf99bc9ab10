package execs

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"sandboxd/internal/execstream"
)

// What the package's external tests (package execs_test, which drive the whole domain through
// internal/domain/domaintest) reach inside a Service.

// Token is the replica token s follows execs under.
func Token(s *Service) string { return s.token }

// Store is s's exec store.
func Store(s *Service) *execstream.Store { return s.store }

// SetEndGrace shortens how long past an exec's timeout a waiting caller waits for its end.
func SetEndGrace(t testing.TB, d time.Duration) {
	old := endGrace
	endGrace = d
	t.Cleanup(func() { endGrace = old })
}

// LogReopens is how many guest logs s's followers opened again after they broke.
func LogReopens(s *Service) float64 { return testutil.ToFloat64(s.metrics.logReopens) }
