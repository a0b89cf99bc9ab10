package execs

import "sandboxd/internal/execstream"

// What the package's external tests (package execs_test, which drive the whole domain through
// internal/domain/domaintest) reach inside a Service.

// Token is the replica token s follows execs under.
func Token(s *Service) string { return s.token }

// Store is s's exec store.
func Store(s *Service) *execstream.Store { return s.store }
