// Package agents runs agent runs: a catalog agent (a coding agent CLI already in the sandbox's
// image) attached to a running sandbox. The instruction and config are uploaded into a folder
// of the workspace (/workspace/.agent-runs/<run id>/), the agent's command line runs there as a
// detached exec, and the sandbox stays alive afterwards. The run's status is derived from that
// exec (and a cancelled flag) by a pure function and stored once final; the run records are
// internal/agentrun's. The sandbox and its execs are reached through two small interfaces,
// Sandboxes and Execs.
package agents

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"time"

	"sandboxd/internal/agentrun"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
	"sandboxd/runtime"
)

// Sandboxes is what agent runs need of the sandbox lifecycle core (internal/sandbox).
type Sandboxes interface {
	// Load finds the caller's sandbox and checks verb against its state (NOT_FOUND for
	// another project's).
	Load(ctx context.Context, p auth.Principal, id string, verb sandbox.Verb) (runtime.Record, error)
	// WriteFile writes a file into the sandbox's workspace.
	WriteFile(ctx context.Context, p auth.Principal, id, path string, mode os.FileMode, r io.Reader) (sandbox.FileInfo, error)
}

// Execs is what agent runs need of exec (internal/execs): an agent is a detached exec.
type Execs interface {
	Exec(ctx context.Context, p auth.Principal, id string, req sandbox.ExecRequest) (sandbox.ExecResult, error)
	GetExec(ctx context.Context, p auth.Principal, sandboxID, execID string, output bool) (sandbox.ExecResult, error)
	ExecOutput(ctx context.Context, p auth.Principal, execID, after string) (<-chan sandbox.ExecEvent, error)
	// CancelExec kills a running exec with every process it started.
	CancelExec(ctx context.Context, p auth.Principal, sandboxID, execID string) error
}

// Deps are what the Service works with besides the sandboxes and their execs.
type Deps struct {
	// Runs keeps agent run records (nil: agent runs answer UNAVAILABLE).
	Runs   *agentrun.Store
	Logger *slog.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Service starts, reads, lists, cancels and streams agent runs.
type Service struct {
	// cfg is the sandbox config as sandbox.New checked it: the catalog and the limits.
	cfg sandbox.Config
	// agents is the catalog by id.
	agents    map[string]sandbox.AgentConfig
	sandboxes Sandboxes
	execs     Execs
	runs      *agentrun.Store
	log       *slog.Logger
	now       func() time.Time
}

// New returns a Service. cfg is the checked config (sandbox.Service.Config): its catalog has
// every default filled in.
func New(cfg sandbox.Config, sandboxes Sandboxes, execs Execs, d Deps) *Service {
	s := &Service{cfg: cfg, agents: map[string]sandbox.AgentConfig{}, sandboxes: sandboxes, execs: execs,
		runs: d.Runs, log: d.Logger, now: d.Now}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	for _, a := range cfg.Agents {
		s.agents[a.ID] = a
	}
	return s
}

// RunsDir is the workspace folder that holds one folder per run.
const RunsDir = "/workspace/.agent-runs"

// queuedGrace is how long a run may stay QUEUED before it counts as abandoned (the replica
// starting it went away between upload and start).
const queuedGrace = 2 * time.Minute

const (
	runPrefix      = "run_"
	maxModelBytes  = 256
	maxListRuns    = 100
	binaryCheckSec = 30
)

func runNotFound(id string) error {
	return apierror.New(apierror.NotFound, "agent run %s not found", apierror.Truncate(id, 64))
}

func (s *Service) runStore() (*agentrun.Store, error) {
	if s.runs == nil {
		return nil, apierror.New(apierror.Unavailable, "agent runs are not configured on this server")
	}
	return s.runs, nil
}

// Agents lists the catalog.
func (s *Service) Agents() []sandbox.AgentConfig { return slices.Clone(s.cfg.Agents) }
