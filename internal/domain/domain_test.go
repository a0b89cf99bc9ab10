package domain_test

import (
	"strings"
	"testing"

	"sandboxd/internal/domain"
	"sandboxd/internal/domain/domaintest"
)

// TestNewRequiresTheStores: a missing store of the core or of exec refuses New, naming what
// is missing.
func TestNewRequiresTheStores(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	for _, tc := range []struct {
		name string
		edit func(*domain.Deps)
		want string
	}{
		{"no_checkpoints", func(d *domain.Deps) { d.Checkpoints = nil }, "checkpoints are required"},
		{"no_exec_store", func(d *domain.Deps) { d.Execs = nil }, "exec store"},
		{"no_events", func(d *domain.Deps) { d.Events = nil }, "events"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := e.NewDeps()
			tc.edit(&d)
			svc, err := domain.New(e.Config, d)
			if err == nil {
				svc.Close()
				t.Fatal("got a service, want an error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
