// Package execs runs commands in sandboxes and follows their output. Exec output travels in
// three hops. The guest init keeps each command's output in a log with byte offsets (the
// command outlives every client). Exactly one replica, the follower, copies that log into the
// exec's bounded Redis Stream (internal/execstream, this package's store), fenced by a lease
// and the stored offset. Every replica serves readers from the stream. The replica that starts
// an exec follows it; when it dies, the reconciler of any replica (the sandbox core's, which
// calls ReconcileExecs on every pass) finds the exec orphaned and follows on from the stored
// offset, so subscribers see every byte once and the exit status.
//
// The sandbox lifecycle core is reached through Sandboxes, defined here.
package execs

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"

	"sandboxd/guest/client"
	"sandboxd/internal/auth"
	"sandboxd/internal/events"
	"sandboxd/internal/execstream"
	"sandboxd/internal/sandbox"
	"sandboxd/runtime"
)

// Sandboxes is what exec needs of the sandbox lifecycle core (internal/sandbox).
type Sandboxes interface {
	// Load finds the caller's sandbox and checks verb against its state (NOT_FOUND for
	// another project's); a caller's load is activity.
	Load(ctx context.Context, p auth.Principal, id string, verb sandbox.Verb) (runtime.Record, error)
	// Guest is a client on the running sandbox's guest init (one attach per sandbox and
	// replica).
	Guest(ctx context.Context, id string) (*client.Client, error)
	// GuestError turns a failed guest call into a client error (a dead sandbox is FAILED).
	GuestError(ctx context.Context, id string, err error) error
	// Box is the runtime's box of sandbox id: its record and phase.
	Box(ctx context.Context, id string) (runtime.Box, error)
	// Observe reconciles a box's record with its phase: a RUNNING box whose compute died is
	// recorded FAILED with the reason.
	Observe(ctx context.Context, box runtime.Box) runtime.Record
	// Touch records activity on a sandbox (for auto-stop), at most once a second per replica.
	Touch(ctx context.Context, id string)
	// TouchNow records activity that auto-stop counts from exactly (a command's end).
	TouchNow(ctx context.Context, id string)
	// HoldStream takes one of the stream places of p's tenant:project on this replica, which
	// event and output streams share.
	HoldStream(p auth.Principal) (release func(), err error)
}

// Deps are what the Service works with besides the sandboxes.
type Deps struct {
	// Store keeps exec output streams and status.
	Store *execstream.Store
	// Events is the project event stream EXEC_STARTED and EXEC_ENDED go on.
	Events *events.Bus
	// ReplicaToken names this replica as an exec follower (a fresh random one when empty).
	ReplicaToken string
	Metrics      *Metrics
	Logger       *slog.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Service starts, follows, takes over, cancels and reads execs.
type Service struct {
	// cfg is the sandbox config as sandbox.New checked it: the limits, the follower lease, the
	// caps on subscriptions and running commands.
	cfg       sandbox.Config
	sandboxes Sandboxes
	store     *execstream.Store
	events    *events.Bus
	metrics   *Metrics
	log       *slog.Logger
	now       func() time.Time
	token     string
	// bg lives as long as the service: followers run on it, not on a request.
	bg        context.Context
	cancel    context.CancelFunc
	followers sync.WaitGroup
	followMu  sync.Mutex
	following map[string]bool // exec ids this replica follows
	// starting counts, per sandbox, the starts this replica waits on the sandbox to answer;
	// stuck names, per sandbox, an exec whose start the sandbox did not answer
	// (client.ErrNoAnswer) and whose follower has not reached the sandbox since. Together they
	// keep a stuck sandbox (its PID 1 stopped or starved) from gathering requests and
	// followers here: at most MaxRunningExecs starts wait on it, and while one went unanswered
	// the next fails at once (beginStart).
	starting  map[string]int
	stuck     map[string]string
	subs      atomic.Int64 // exec output streams this replica serves
	lastSweep atomic.Int64
	// endedSinceSweep is the output of the execs that ended here since the last sweep
	// (endedOutput).
	endedSinceSweep atomic.Int64
	// released gathers the execs whose exit this replica stored, for their guests to forget
	// (release.go).
	released releaser
}

// New returns a Service. cfg is the checked config (sandbox.Service.Config).
func New(cfg sandbox.Config, sandboxes Sandboxes, d Deps) (*Service, error) {
	if d.Store == nil || d.Events == nil {
		return nil, errors.New("execs: the exec store and the event bus are required")
	}
	s := &Service{cfg: cfg, sandboxes: sandboxes, store: d.Store, events: d.Events, metrics: d.Metrics,
		log: d.Logger, now: d.Now, token: d.ReplicaToken, following: map[string]bool{},
		starting: map[string]int{}, stuck: map[string]string{}}
	if s.token == "" {
		s.token = "replica_" + ulid.Make().String()
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.metrics == nil {
		s.metrics = NewMetrics(nil)
	}
	s.bg, s.cancel = context.WithCancel(context.Background())
	s.followers.Add(1)
	go s.releaseLoop()
	return s, nil
}

// Close stops following execs: their leases are released, so another replica follows on at
// once. The commands keep running.
func (s *Service) Close() {
	s.cancel()
	s.followers.Wait()
}

const execPrefix = "exec_"
