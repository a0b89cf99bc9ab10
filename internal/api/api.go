// Package api declares the one service interface both skins call: the REST handlers
// (internal/rest) and the GraphQL resolvers (resolvers). *domain.Service implements it;
// apitest holds the fake that both skins' unit tests share.
package api

import (
	"context"
	"io"
	"os"

	"sandboxd/internal/auth"
	"sandboxd/internal/domain"
	"sandboxd/internal/quota"
	"sandboxd/internal/sandbox"
)

// Service is what REST and GraphQL need of the domain service: the union of what either
// calls. Errors are *apierror.Error with a code, or plain errors that clients see as
// "internal error".
type Service interface {
	// ---- sandboxes ----

	Create(ctx context.Context, p auth.Principal, req sandbox.CreateRequest) (sandbox.Sandbox, error)
	Get(ctx context.Context, p auth.Principal, id string) (sandbox.Sandbox, error)
	List(ctx context.Context, p auth.Principal, opts sandbox.ListOptions) (sandbox.Page, error)
	Stop(ctx context.Context, p auth.Principal, id string) (sandbox.Sandbox, error)
	Start(ctx context.Context, p auth.Principal, id string) (sandbox.Sandbox, error)
	Destroy(ctx context.Context, p auth.Principal, id string) (sandbox.DestroyResult, error)
	// Pause keeps a running sandbox's memory and workspace and releases its compute and slot;
	// Resume brings it back with its processes (or starts it on its workspace when they cannot
	// come back: state_reason says so). Resume takes a slot.
	Pause(ctx context.Context, p auth.Principal, id string) (sandbox.Sandbox, error)
	Resume(ctx context.Context, p auth.Principal, id string) (sandbox.Sandbox, error)
	// Update changes a sandbox's labels (a merge patch), autostop_sec and ttl_sec.
	Update(ctx context.Context, p auth.Principal, id string, req sandbox.UpdateRequest) (sandbox.Sandbox, error)
	// EventsFunc streams status changes after the cursor to deliver, in order, on a goroutine
	// of the service's; sandboxID "" means the caller's whole project. deliver returns false to
	// stop. The stream ends when ctx ends, when deliver refuses, after a watched sandbox's
	// DESTROYED, or when the event store fails for good; ended runs once then, after the last
	// deliver, on the same goroutine.
	EventsFunc(ctx context.Context, p auth.Principal, sandboxID, after string, deliver func(sandbox.Event) bool, ended func()) error
	// EventsCursor is the cursor of the newest status event of the caller's project: Events
	// after it misses nothing that happened after this call.
	EventsCursor(ctx context.Context, p auth.Principal) (string, error)
	// Quota reports the caller's concurrency limit and use.
	Quota(ctx context.Context, p auth.Principal) (quota.Usage, error)
	Profiles() []sandbox.Profile
	// Limits are the configured bounds (REST checks an upload's size against them).
	Limits() sandbox.Limits

	// ---- exec ----

	// Exec runs a command; with req.Detach it answers at once with the exec RUNNING.
	Exec(ctx context.Context, p auth.Principal, id string, req sandbox.ExecRequest) (sandbox.ExecResult, error)
	// GetExec returns an exec's status, and its output as far as still kept when output is
	// set; sandboxID "" means any sandbox of the caller's project.
	GetExec(ctx context.Context, p auth.Principal, sandboxID, execID string, output bool) (sandbox.ExecResult, error)
	// ExecOutput replays an exec's output after the cursor and follows it; the channel closes
	// after the EXIT event or when ctx ends.
	ExecOutput(ctx context.Context, p auth.Principal, execID, after string) (<-chan sandbox.ExecEvent, error)
	// ExecOutputStatus is ExecOutput of an exec of sandboxID ("" means any sandbox of the
	// caller's project) that also returns the exec's status (without output) as the
	// subscription found it: GetExec and ExecOutput in one call.
	ExecOutputStatus(ctx context.Context, p auth.Principal, sandboxID, execID, after string) (sandbox.ExecResult, <-chan sandbox.ExecEvent, error)
	// ListExecs lists a sandbox's execs, newest first, without output.
	ListExecs(ctx context.Context, p auth.Principal, sandboxID string, opts sandbox.ExecListOptions) (sandbox.ExecPage, error)
	// SignalExec signals a running exec's whole process tree and answers its status;
	// sandboxID "" means any sandbox of the caller's project (as for the three below).
	SignalExec(ctx context.Context, p auth.Principal, sandboxID, execID, signal string) (sandbox.ExecResult, error)
	// WriteStdin writes to an open stdin, and closes it after the bytes when closeAfter is set.
	WriteStdin(ctx context.Context, p auth.Principal, sandboxID, execID string, data []byte, closeAfter bool) (sandbox.StdinResult, error)
	// ResizeTty sets the terminal size of an exec run under a terminal.
	ResizeTty(ctx context.Context, p auth.Principal, sandboxID, execID string, size sandbox.TtySize) (sandbox.ExecResult, error)

	// ---- files ----

	// ReadFile answers PAYLOAD_TOO_LARGE when the file is larger than maxBytes.
	ReadFile(ctx context.Context, p auth.Principal, id, path string, maxBytes int64) ([]byte, sandbox.FileInfo, error)
	// OpenFile streams a file; the caller closes the reader.
	OpenFile(ctx context.Context, p auth.Principal, id, path string) (io.ReadCloser, sandbox.FileInfo, error)
	// WriteFile writes r to path; mode 0 means 0644.
	WriteFile(ctx context.Context, p auth.Principal, id, path string, mode os.FileMode, r io.Reader) (sandbox.FileInfo, error)
	// ListDir returns at most limit entries and whether there were more.
	ListDir(ctx context.Context, p auth.Principal, id, path string, limit int) ([]sandbox.FileInfo, bool, error)
	// FilePage returns one page of a folder in name order, after a cursor it handed out.
	FilePage(ctx context.Context, p auth.Principal, id, path string, opts sandbox.FileListOptions) (sandbox.FilePage, error)
	// StatFile describes a path; a symlink is reported as one, never followed.
	StatFile(ctx context.Context, p auth.Principal, id, path string) (sandbox.FileInfo, error)
	// MakeDir makes a directory and its parents; created is false when it existed already.
	MakeDir(ctx context.Context, p auth.Principal, id, path string) (info sandbox.FileInfo, created bool, err error)
	// MoveFile renames from to to; an existing to is ALREADY_EXISTS unless overwrite.
	MoveFile(ctx context.Context, p auth.Principal, id, from, to string, overwrite bool) (sandbox.FileInfo, error)
	// DeleteFile deletes a path; a directory that is not empty only with recursive.
	DeleteFile(ctx context.Context, p auth.Principal, id, path string, recursive bool) error
	// WatchFiles follows changes below a directory, from now on or after req.After; the
	// channel closes when ctx ends or after an ERROR event.
	WatchFiles(ctx context.Context, p auth.Principal, id string, req sandbox.WatchRequest) (<-chan sandbox.FileEvent, error)

	// ---- snapshots ----

	// Snapshot checkpoints a running sandbox without stopping it.
	Snapshot(ctx context.Context, p auth.Principal, id string) (sandbox.SnapshotInfo, error)
	// ListSnapshots lists snapshots newest first; sandboxID "" means the caller's whole project.
	ListSnapshots(ctx context.Context, p auth.Principal, sandboxID string, limit int) ([]sandbox.SnapshotInfo, error)
	// SnapshotPage is one page of ListSnapshots' list after a cursor (GraphQL's connection).
	SnapshotPage(ctx context.Context, p auth.Principal, sandboxID string, opts sandbox.SnapshotListOptions) (sandbox.SnapshotPage, error)
	DeleteSnapshot(ctx context.Context, p auth.Principal, snapshotID string) error
	// GetSnapshot returns one snapshot of the caller's project (GraphQL's node and references).
	GetSnapshot(ctx context.Context, p auth.Principal, snapshotID string) (sandbox.SnapshotInfo, error)

	// ---- agent runs ----

	// StartAgentRun attaches a catalog agent to a running sandbox as a detached exec.
	StartAgentRun(ctx context.Context, p auth.Principal, req sandbox.AgentRunRequest) (sandbox.AgentRun, error)
	GetAgentRun(ctx context.Context, p auth.Principal, runID string) (sandbox.AgentRun, error)
	// ListAgentRuns lists a sandbox's runs, newest first.
	ListAgentRuns(ctx context.Context, p auth.Principal, sandboxID string) ([]sandbox.AgentRun, error)
	// AgentRunPage is one page of a sandbox's runs after a cursor (GraphQL's connection).
	AgentRunPage(ctx context.Context, p auth.Principal, sandboxID string, opts sandbox.AgentRunListOptions) (sandbox.AgentRunPage, error)
	// CancelAgentRun kills the agent's process tree and answers once it ended.
	CancelAgentRun(ctx context.Context, p auth.Principal, runID string) (sandbox.AgentRun, error)
	// AgentRunEvents streams a run's status and output; it closes after the final status.
	AgentRunEvents(ctx context.Context, p auth.Principal, runID, after string) (<-chan sandbox.AgentRunEvent, error)
}

// The domain service is what production passes to both skins.
var _ Service = (*domain.Service)(nil)
