// Package apitest is the fake api.Service that the unit tests of both skins (internal/rest and
// resolvers) share: a small in-memory world of fixtures with known ids, answers a test may
// replace before its requests, and a log of every call with its arguments.
//
// Special sandbox ids make every verb fail in one way (SandboxBusy, SandboxBoom, SandboxPanic);
// any id the fake does not know is NOT_FOUND, as another tenant's sandbox is.
package apitest

import (
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"sandboxd/internal/api"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// Sandboxes the fake knows. Anything else is NOT_FOUND.
const (
	// SandboxRunning is RUNNING, in the caller's tenant:project.
	SandboxRunning = "sbx_01HZZZZZZZZZZZZZZZZZZZZZZZ"
	// SandboxBusy answers every verb INVALID_STATE (STOPPING) with Retry-After.
	SandboxBusy = "sbx_busy"
	// SandboxBoom answers every verb a plain (uncoded) error whose text is SecretCause.
	SandboxBoom = "sbx_boom"
	// SandboxPanic makes every verb panic.
	SandboxPanic = "sbx_panic"
	// sandboxListed is the second sandbox List answers, and its next cursor.
	sandboxListed = "sbx_01HYYYYYYYYYYYYYYYYYYYYYYY"
)

// Execs the fake knows (Fake.Execs), both of SandboxRunning. Anything else is NOT_FOUND.
const (
	// ExecEnded ended with exit code 3 ("'make' 'test'"); it is also the id of the result of
	// a waited Exec.
	ExecEnded = "exec_1"
	// ExecRunning is RUNNING ("'sleep' '60'"); it is also the id of a detached Exec.
	ExecRunning = "exec_2"
	// BadCursor is the cursor ExecOutput refuses with INVALID_ARGUMENT (field "after").
	BadCursor = "nope"
)

// Snapshots of SandboxRunning the fake knows (Fake.Snapshots), newest first.
const (
	SnapLatest = "snap_01HZZZZZZZZZZZZZZZZZZZZZZZ_0000000002" // DeleteSnapshot: INVALID_STATE (the only copy)
	SnapOld    = "snap_01HZZZZZZZZZZZZZZZZZZZZZZZ_0000000001"
	// SnapDestroyed is the snapshot Destroy answers that it took.
	SnapDestroyed = "snap_9"
)

// EventsCursorNow is the cursor EventsCursor answers.
const EventsCursorNow = "1735787045000-3"

// Agent runs the fake knows (Fake.Runs), both in SandboxRunning. Anything else is NOT_FOUND.
const (
	// RunRunning is RUNNING as the detached exec ExecRunning.
	RunRunning = "run_01HZZZZZZZZZZZZZZZZZZZZZZZ"
	// RunDone SUCCEEDED.
	RunDone = "run_01HZZZZZZZZZZZZZZZZZZZZZZY"
)

// SecretCause is the text of the fake's uncoded error; it must never reach a client.
const SecretCause = "redis: dial tcp 10.0.0.7:6379: password=hunter2"

// Keys of Authenticator.
const (
	// UserKey is the key "user" of acme:web.
	UserKey = "key-user"
	// PlatformKey is the platform key "platform" (of plat:ops): it may act for any project.
	PlatformKey = "key-platform"
)

// T0 is the time of the fixtures: sandboxes, execs and runs started then.
var T0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// Authenticator accepts UserKey and PlatformKey.
func Authenticator(t testing.TB) *auth.Authenticator {
	t.Helper()
	a, err := auth.New([]auth.Key{
		{Name: "user", SHA256: auth.HashKey(UserKey), Tenant: "acme", Project: "web"},
		{Name: "platform", SHA256: auth.HashKey(PlatformKey), Tenant: "plat", Project: "ops", Platform: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Fake implements api.Service over the fixtures. Its exported fields are its answers: New
// sets them; a test may replace them before the requests that use them (the fake reads them
// under its lock, the test writes them without one, so not while a request runs).
type Fake struct {
	// ExecStdout is the stdout of the result a waited Exec answers (ExecEnded, exit code 3,
	// stderr "warn\n", stdout marked truncated).
	ExecStdout []byte
	// ExecResult, when set, is what Exec answers instead, waited or not.
	ExecResult *sandbox.ExecResult
	// ExecErr fails Exec; OutputErr fails ExecOutput.
	ExecErr, OutputErr error
	// Execs are the known execs by id, with their output: GetExec answers them (without the
	// output unless asked), ExecOutput follows them. New adds ExecEnded and ExecRunning, each
	// with stdout "hello\n" and stderr "oops\xff" (truncated).
	Execs map[string]sandbox.ExecResult
	// ExecEvents are what ExecOutput replays after its cursor, by exec id. Then it closes its
	// channel, as the domain does after EXIT, unless ExecEndless is set (it sends CHUNKs of
	// ExecEndless until the subscriber's ctx ends) or ExecHold is (it sends nothing more until
	// the ctx ends).
	ExecEvents  map[string][]sandbox.ExecEvent
	ExecEndless []byte
	ExecHold    bool

	// StdinErr, when set, is what WriteStdin answers for ExecRunning instead of taking the
	// bytes (e.g. the LIMIT_EXCEEDED of a full stdin buffer).
	StdinErr error

	// File is what ReadFile and OpenFile answer.
	File []byte
	// FileEvents are what WatchFiles sends after its cursor (New sets FileEventFixtures); then
	// the stream stays open until the subscriber goes away, unless FileEventsEnd is set.
	FileEvents    []sandbox.FileEvent
	FileEventsEnd bool

	// SandboxEvents are what Events sends, after SandboxEventsDelay; then the stream stays
	// open until the subscriber goes away, unless SandboxEventsEnd is set.
	SandboxEvents      []sandbox.Event
	SandboxEventsEnd   bool
	SandboxEventsDelay time.Duration

	// Snapshots answer Snapshot (the first) and ListSnapshots, and are what DeleteSnapshot
	// finds. New sets SnapLatest and SnapOld. SnapshotErr fails all three.
	Snapshots   []sandbox.SnapshotInfo
	SnapshotErr error
	// LatestSnapshot, when set, is the latest snapshot id of the sandboxes Get answers.
	LatestSnapshot string

	// Runs are the known agent runs by id (New adds RunRunning and RunDone). StartAgentRun
	// answers Runs[RunRunning]; CancelAgentRun cancels a run in place. RunErr fails
	// StartAgentRun and GetAgentRun. RunEvents, when set, are what AgentRunEvents sends
	// instead of the run's status, a chunk, a gap and its final status (SUCCEEDED).
	Runs      map[string]sandbox.AgentRun
	RunErr    error
	RunEvents []sandbox.AgentRunEvent

	mu    sync.Mutex
	calls []Call
	// streams counts the stream producers (Events, ExecOutput, AgentRunEvents) still running.
	streams sync.WaitGroup
	// subscribed gets a value for every ExecOutput stream started; execDone and eventsDone
	// one for every ExecOutput and Events stream ended. Sends never block: a test that does
	// not read them loses the values past the buffer, not a goroutine.
	subscribed chan struct{}
	execDone   chan ExecStreamEnd
	eventsDone chan struct{}
}

var _ api.Service = (*Fake)(nil)

// signalBuffer bounds the signal channels.
const signalBuffer = 128

// New returns a fake over the fixtures.
func New() *Fake {
	return &Fake{
		Execs: map[string]sandbox.ExecResult{
			ExecEnded:   withOutput(EndedExec()),
			ExecRunning: withOutput(RunningExec(SandboxRunning)),
		},
		ExecEvents: map[string][]sandbox.ExecEvent{},
		Snapshots:  snapshots(),
		FileEvents: FileEventFixtures(),
		Runs:       map[string]sandbox.AgentRun{RunRunning: agentRun(RunRunning), RunDone: agentRun(RunDone)},
		subscribed: make(chan struct{}, signalBuffer),
		execDone:   make(chan ExecStreamEnd, signalBuffer),
		eventsDone: make(chan struct{}, signalBuffer),
	}
}

// ---- the call log ----

// A Call is one call the fake answered, with the arguments it got. Only the fields of the
// method's arguments are set.
type Call struct {
	Method    string
	Principal auth.Principal
	// SandboxID is the sandbox the call names: the id of Get, Exec, Stop, the file calls…,
	// the sandboxID of GetExec, Events, ListSnapshots and ListAgentRuns, the request's of
	// StartAgentRun.
	SandboxID string
	// ID is the exec, snapshot or agent run the call names.
	ID string
	// After is the cursor of ExecOutput, Events, AgentRunEvents, SnapshotPage,
	// AgentRunPage and FilePage.
	After string
	// Output is GetExec's output flag.
	Output bool
	// Path, MaxBytes, Mode and Data are the file calls' arguments (Data: what WriteFile
	// read); Limit is ListDir's, FilePage's, ListSnapshots', SnapshotPage's and AgentRunPage's.
	Path     string
	MaxBytes int64
	Mode     os.FileMode
	Data     []byte
	Limit    int
	// Target, Recursive and Overwrite are MoveFile's to and flags and DeleteFile's; Watch is
	// WatchFiles' request.
	Target    string
	Recursive bool
	Overwrite bool
	Watch     sandbox.WatchRequest
	// The request of Create, List, Exec and StartAgentRun.
	Create   sandbox.CreateRequest
	List     sandbox.ListOptions
	Exec     sandbox.ExecRequest
	AgentRun sandbox.AgentRunRequest
	// Update is the request of Update.
	Update sandbox.UpdateRequest
	// ExecList is ListExecs' options; Signal SignalExec's signal; Close WriteStdin's
	// closeAfter (its bytes are Data); Tty ResizeTty's size.
	ExecList sandbox.ExecListOptions
	Signal   string
	Close    bool
	Tty      sandbox.TtySize
}

func (f *Fake) record(c Call) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
}

// Calls are the calls so far, in order.
func (f *Fake) Calls() []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Call(nil), f.calls...)
}

// CallsTo are the calls of one method so far, in order.
func (f *Fake) CallsTo(method string) []Call {
	var out []Call
	for _, c := range f.Calls() {
		if c.Method == method {
			out = append(out, c)
		}
	}
	return out
}

// Last is the last call of method, or a zero Call when there was none.
func (f *Fake) Last(method string) Call {
	calls := f.CallsTo(method)
	if len(calls) == 0 {
		return Call{}
	}
	return calls[len(calls)-1]
}

// Called are the names of the methods called so far, in order.
func (f *Fake) Called() []string {
	var out []string
	for _, c := range f.Calls() {
		out = append(out, c.Method)
	}
	return out
}

// LastPrincipal is the principal of the last call (Profiles and Limits take none: zero).
func (f *Fake) LastPrincipal() auth.Principal {
	calls := f.Calls()
	if len(calls) == 0 {
		return auth.Principal{}
	}
	return calls[len(calls)-1].Principal
}

// ---- streams ----

// ExecStreamEnd is how an ExecOutput stream ended: the events it sent, and whether it ran out
// of them and closed its channel (else the subscriber's ctx ended first).
type ExecStreamEnd struct {
	Sent    int
	Drained bool
}

// ExecDone gets how each ExecOutput stream ended.
func (f *Fake) ExecDone() <-chan ExecStreamEnd { return f.execDone }

// EventsDone gets a value when an Events stream has ended (its ctx ended or it ran out).
func (f *Fake) EventsDone() <-chan struct{} { return f.eventsDone }

// WaitSubscribed fails t unless an ExecOutput stream starts within d (or started before and
// was not waited for yet).
func (f *Fake) WaitSubscribed(t testing.TB, d time.Duration) {
	t.Helper()
	select {
	case <-f.subscribed:
	case <-time.After(d):
		t.Fatalf("no output subscription after %v, want one", d)
	}
}

// WaitStreams fails t unless every stream the fake started (Events, ExecOutput,
// AgentRunEvents, WatchFiles) has ended within d: its subscriber went away or it ran out.
func (f *Fake) WaitStreams(t testing.TB, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		f.streams.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("a stream of the service still runs after %v, want it ended", d)
	}
}

func signal[T any](ch chan T, v T) {
	select {
	case ch <- v:
	default:
	}
}

// ---- fixtures ----

// lookup answers the special ids: SandboxRunning as the caller's, the failing ones, and
// NOT_FOUND for the rest.
func lookup(p auth.Principal, id string) (sandbox.Sandbox, error) {
	switch id {
	case SandboxRunning:
		return runningSandbox(p), nil
	case SandboxBusy:
		return sandbox.Sandbox{}, sandbox.Check(sandbox.Stopping, sandbox.VerbStart, id)
	case SandboxBoom:
		return sandbox.Sandbox{}, errors.New(SecretCause)
	case SandboxPanic:
		panic("fake: " + SecretCause)
	}
	return sandbox.Sandbox{}, apierror.New(apierror.NotFound, "sandbox %s not found", id)
}

func runningSandbox(p auth.Principal) sandbox.Sandbox {
	return sandbox.Sandbox{ID: SandboxRunning, Tenant: p.Tenant, Project: p.Project, Profile: "sandboxes-default",
		State: sandbox.Running, CreatedAt: T0, StateChangedAt: T0.Add(time.Second), AutostopSec: 1800,
		TTLSec: 3600, MilliCPU: 2000, MemoryBytes: 4 << 30, DiskBytes: 10 << 30, Network: "none",
		NetworkPolicy: sandbox.NetworkPolicy{Mode: "none"}, AutostopAction: sandbox.AutostopStop}
}
