package sandbox

import (
	"context"
	"testing"
	"time"

	"sandboxd/internal/auth"
	"sandboxd/internal/checkpoint"
	"sandboxd/runtime"
)

// What the package's external tests (package sandbox_test, which drive the whole domain through
// internal/domain/domaintest) reach inside the core.

// The record annotations that name a sandbox's source.
const (
	AnnSourceArchive  = annSourceArchive
	AnnSourceSnapshot = annSourceSnapshot
)

// AnnMemoryPending is the record annotation of a paused sandbox's image not stored yet.
const AnnMemoryPending = annMemoryPending

// MemoryKept reports whether a record names a memory image of its sandbox, stored or on its way.
func MemoryKept(rec runtime.Record) bool { return memoryKept(rec) }

// MemoryStores is how many memory image stores s runs.
func MemoryStores(s *Service) int { return s.memStores.count() }

// ScopeOf is the checkpoint scope of a sandbox's record.
func ScopeOf(rec runtime.Record) checkpoint.Scope { return scopeOf(rec) }

// WaitRecovering waits for the starts of lost sandboxes that s began.
func WaitRecovering(s *Service) { s.recovering.Wait() }

// SetProgressEvery sets how often s records and publishes a bootstrap's progress.
func SetProgressEvery(s *Service, d time.Duration) { s.boot.every = d }

// Retain applies checkpoint retention to a sandbox, never deleting latest.
func Retain(ctx context.Context, s *Service, rec runtime.Record, latest string) {
	s.ckpts.retain(ctx, rec, latest)
}

// CreateSource checks a create's source as Create does before it takes a slot.
func CreateSource(ctx context.Context, s *Service, p auth.Principal, src *Source, diskBytes int64) error {
	_, err := s.boot.check(ctx, p, src, diskBytes)
	return err
}

// SetWarmUpArgv sets the command pool boxes run before they are ready, until the test ends.
// Call it before the domain is made (its pools start filling at once).
func SetWarmUpArgv(t interface{ Cleanup(func()) }, argv []string) {
	old := warmUpArgv
	warmUpArgv = argv
	t.Cleanup(func() { warmUpArgv = old })
}

// SetBusyTimeout shortens the reconciler's bound on asking a guest whether a command runs.
func SetBusyTimeout(t testing.TB, d time.Duration) {
	old := busyTimeout
	busyTimeout = d
	t.Cleanup(func() { busyTimeout = old })
}

// Busy is the reconciler's question whether a command runs in sandbox id.
func Busy(s *Service, ctx context.Context, id string) bool { return s.recon.busy(ctx, id) }
