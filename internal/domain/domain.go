// Package domain assembles the one value both skins (internal/rest, resolvers) call: the
// sandbox lifecycle core (internal/sandbox), exec (internal/execs) and agent runs
// (internal/agents), wired to each other through the small interfaces each defines where it
// is used. It adds no behaviour: the skins see the services' methods, embedded, as one value.
package domain

import (
	"log/slog"
	"time"

	"sandboxd/internal/agentrun"
	"sandboxd/internal/agents"
	"sandboxd/internal/checkpoint"
	"sandboxd/internal/events"
	"sandboxd/internal/execs"
	"sandboxd/internal/execstream"
	"sandboxd/internal/quota"
	"sandboxd/internal/sandbox"
	"sandboxd/internal/source"
	"sandboxd/internal/store"
	"sandboxd/runtime"
)

// The services, under names that tell the embedded fields apart.
type (
	// Core is the sandbox lifecycle core: create, get, list, stop, start, destroy, files,
	// events, snapshots, quota, the reconciler.
	Core = sandbox.Service
	// Execs are the commands run in sandboxes: start, follow, take over, cancel, read.
	Execs = execs.Service
	// AgentRuns are the agent runs attached to running sandboxes.
	AgentRuns = agents.Service
)

// Service is the domain service as the skins see it.
type Service struct {
	*Core
	*Execs
	*AgentRuns
}

// Deps are the components the services work with.
type Deps struct {
	Driver      runtime.Driver
	Store       *store.Store
	Events      *events.Bus
	Checkpoints *checkpoint.Store
	// Execs keeps exec output streams and status.
	Execs *execstream.Store
	// AgentRuns keeps agent run records (nil: agent runs answer UNAVAILABLE).
	AgentRuns *agentrun.Store
	// ReplicaToken names this replica as an exec follower (a fresh random one when empty).
	ReplicaToken string
	// Quota holds the concurrency slots; nil means no limits.
	Quota *quota.Quota
	// Sources fetches bootstrap archives and GCS prefixes (nil: a Fetcher with the
	// defaults, which allow-lists no host).
	Sources *source.Fetcher
	// SourceObjects lists and reads the objects of a source.gcs_prefix; it is required when
	// Config.SourcePrefixes permits any. It may make its client lazily, on first use.
	SourceObjects source.ObjectLister
	// Resolve resolves the host names of egress allow lists (nil: through the configured
	// resolvers).
	Resolve sandbox.Resolver
	// Pooler is the runtime's side of warm pools (nil: none; see sandbox.Deps).
	Pooler runtime.Pooler

	Metrics *sandbox.Metrics
	// ExecMetrics are exec's (sandboxd_exec_duration_seconds); nil: not registered.
	ExecMetrics *execs.Metrics
	Logger      *slog.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// New checks cfg and returns the services wired to each other.
func New(cfg sandbox.Config, d Deps) (*Service, error) {
	core, err := sandbox.New(cfg, sandbox.Deps{Driver: d.Driver, Store: d.Store, Events: d.Events,
		Checkpoints: d.Checkpoints, Quota: d.Quota, Sources: d.Sources, SourceObjects: d.SourceObjects,
		Resolve: d.Resolve, Pooler: d.Pooler, Metrics: d.Metrics, Logger: d.Logger, Now: d.Now})
	if err != nil {
		return nil, err
	}
	x, err := execs.New(core.Config(), core, execs.Deps{Store: d.Execs, Events: d.Events, ReplicaToken: d.ReplicaToken,
		Metrics: d.ExecMetrics, Logger: d.Logger, Now: d.Now})
	if err != nil {
		core.Close()
		return nil, err
	}
	// The core's reconciler follows on orphaned execs and sweeps ended ones through x.
	core.SetExecReconciler(x)
	runs := agents.New(core.Config(), core, x, agents.Deps{Runs: d.AgentRuns, Logger: d.Logger, Now: d.Now})
	return &Service{Core: core, Execs: x, AgentRuns: runs}, nil
}

// Close stops following execs (their leases are released, so another replica follows on at
// once), then drops this replica's attach streams. Sandboxes, commands and agents keep running.
func (s *Service) Close() {
	s.Execs.Close()
	s.Core.Close()
}
