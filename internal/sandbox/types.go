package sandbox

import (
	"time"
)

// Sandbox is what clients see of one sandbox.
type Sandbox struct {
	ID             string
	Tenant         string
	Project        string
	Profile        string
	State          State
	StateReason    string
	CreatedAt      time.Time
	StateChangedAt time.Time
	AutostopSec    int64
	TTLSec         int64
	// AutostopAt is when a running sandbox stops if nothing happens before (zero otherwise).
	AutostopAt time.Time
	// LatestSnapshotID is the newest complete workspace checkpoint, "" when none.
	LatestSnapshotID string
	MilliCPU         int64
	MemoryBytes      int64
	DiskBytes        int64
	// Network is the mode of NetworkPolicy: "none" or "egress".
	Network       string
	NetworkPolicy NetworkPolicy
	// Labels are the caller's labels (labels.go); nil when it has none.
	Labels map[string]string
	// AutostopAction is what idle auto-stop does: "stop", or "pause" (pause.go).
	AutostopAction string
	// AutoResume: exec and file calls on the PAUSED sandbox resume it first.
	AutoResume bool
}

// ExpiresAt is when the sandbox's TTL ends (zero when it has none).
func (s Sandbox) ExpiresAt() time.Time { return ExpiresAt(s.CreatedAt, s.TTLSec) }

// CreateRequest creates a sandbox. Nil fields take the configured defaults.
type CreateRequest struct {
	Profile     string
	AutostopSec *int64
	TTLSec      *int64
	Env         map[string]string
	// Source, when set, bootstraps the workspace once, before the sandbox is RUNNING.
	Source *Source
	// Labels tag the sandbox (labels.go): at most Limits.MaxLabels, none reserved.
	Labels map[string]string
	// Network narrows the profile's network policy (nil: the profile's).
	Network *NetworkRequest
	// AutostopAction is what idle auto-stop does: AutostopStop ("stop", the default when
	// empty) or AutostopPause ("pause": keep the processes, pause.go).
	AutostopAction string
	// AutoResume makes exec and file calls on the PAUSED sandbox resume it first, instead of
	// answering INVALID_STATE.
	AutoResume bool
}

// UpdateRequest changes an existing sandbox. Nil fields are left as they are; at least one
// must be set.
type UpdateRequest struct {
	// Labels is a JSON merge patch of the sandbox's labels: a key with a value sets that
	// label, a key with nil removes it, labels it does not name are kept.
	Labels map[string]*string
	// ClearLabels removes every label before Labels is applied (the merge patch's
	// "labels": null).
	ClearLabels bool
	// AutostopSec and TTLSec replace the sandbox's, within the same bounds as at create;
	// ttl_sec still counts from the creation, and may not end the sandbox's life before now.
	AutostopSec *int64
	TTLSec      *int64
}

// Source is where a new sandbox's workspace comes from. Exactly one field is set.
type Source struct {
	// SnapshotID is a snapshot of the caller's tenant:project (of any of its sandboxes,
	// destroyed ones included).
	SnapshotID string
	// ArchiveURL is an HTTPS archive (zip, tar, tar.gz or tar.zst, told by its bytes) on a
	// public address, or on a host that config allow-lists.
	ArchiveURL string
	// GCSPrefix is "gs://bucket/prefix/": the objects under it, when config permits the
	// prefix to the caller's tenant:project.
	GCSPrefix string
}

// SnapshotInfo describes one workspace snapshot (a checkpoint).
type SnapshotInfo struct {
	// ID is "snap_" + the sandbox id's ULID + "_" + a sequence number.
	ID        string
	SandboxID string
	CreatedAt time.Time
	// SizeBytes is the stored (compressed) size; RawSizeBytes the size of the workspace's tar.
	SizeBytes    int64
	RawSizeBytes int64
	// SHA256 is the hex sha256 of the stored bytes, checked on every restore.
	SHA256 string
	// Parent is the snapshot the workspace came from ("" for none); it may belong to another
	// sandbox (the source of a create).
	Parent string
}

// ExecRequest runs one command in a sandbox's workspace.
type ExecRequest struct {
	Command []string
	// TimeoutSec nil takes the configured default.
	TimeoutSec *int64
	Env        map[string]string
	// Cwd defaults to /workspace.
	Cwd   string
	Stdin []byte
	// Detach answers at once with the exec's id and state RUNNING instead of waiting for the
	// end (GraphQL wait: false, REST "wait": false); the command runs on after the caller has
	// gone. Its output and status are then read with ExecOutput and GetExec, from any replica.
	Detach bool
	// StdinOpen keeps the command's stdin open after Stdin: more bytes come with WriteStdin,
	// which also closes it.
	StdinOpen bool
	// Tty runs the command under a pseudo-terminal of this size (its output is one stream,
	// stdout; its stdin is open); nil means pipes.
	Tty *TtySize
}

// TtySize is a terminal's size in character cells (1 to 1000 each).
type TtySize struct {
	Rows int
	Cols int
}

// ExecState is where an exec is.
type ExecState string

// The exec states.
const (
	// ExecRunning: started, not ended yet.
	ExecRunning ExecState = "RUNNING"
	// ExecEnded: the exit status is known (exited, killed, timed out, or could not be
	// followed to its end: then Error says why).
	ExecEnded ExecState = "ENDED"
)

// ExecResult is the result of an exec: collected when it ended, or its status so far. The
// exit fields (ExitCode, Signal, TimedOut, Duration, EndedAt, Error) mean something only when
// State is ExecEnded.
type ExecResult struct {
	ExecID    string
	SandboxID string
	// Command is a short, shell-quoted summary of the command line (at most 256 bytes).
	Command  string
	State    ExecState
	ExitCode int
	// Signal names the signal that ended the command ("SIGKILL"), "" when it exited.
	Signal    string
	TimedOut  bool
	Duration  time.Duration
	StartedAt time.Time
	EndedAt   time.Time
	// Stdout and Stderr are the newest bytes of each (at most the exec output cap);
	// StdoutTruncated and StderrTruncated say that the command wrote more than they hold (the
	// cap cut the oldest bytes, or the bounded logs no longer had them).
	Stdout          []byte
	Stderr          []byte
	StdoutTruncated bool
	StderrTruncated bool
	// OutputBytes counts the bytes the command wrote (stdout and stderr), kept or not: exact
	// once ended (the sandbox counts them), the bytes copied so far while running.
	OutputBytes int64
	// Error says why the command could not start, or could not be followed to its end.
	Error string
	// StdinOpen says that the command's stdin takes bytes (WriteStdin): it was started with
	// StdinOpen or a Tty, stdin was not closed yet, and it runs.
	StdinOpen bool
	// Tty is the terminal's current size for a command run under one, nil otherwise.
	Tty *TtySize
}

// The signals SignalExec delivers (to the exec's whole process tree).
var ExecSignals = []string{"SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"}

// StdinResult answers WriteStdin.
type StdinResult struct {
	// Written is how many bytes were taken: all of them (a write is taken whole or refused).
	Written int64
	// Buffered is how many bytes the command has not read yet, this write's included.
	Buffered int64
	// Closed says that stdin is closed now (the call asked for it, or the command ended).
	Closed bool
}

// ExecListOptions selects a page of one sandbox's execs, newest first.
type ExecListOptions struct {
	// State filters by state when not empty.
	State ExecState
	// After is the cursor of the last exec of the previous page (its id).
	After string
	// Limit is the page size (default 50, at most the configured page maximum).
	Limit int
}

// ExecPage is one page of a sandbox's execs (without output).
type ExecPage struct {
	Execs []ExecResult
	// NextCursor is the cursor of the next page, "" on the last page.
	NextCursor string
}

// ExecEventKind says what an ExecEvent carries.
type ExecEventKind string

// The exec output event kinds.
const (
	// ExecChunk carries output: Stream and Data.
	ExecChunk ExecEventKind = "CHUNK"
	// ExecTruncated says that output between the previous cursor and this one is no longer
	// kept (the stream and the sandbox's log are bounded and keep the newest output):
	// MissedBytes were dropped. Never a silent gap.
	ExecTruncated ExecEventKind = "TRUNCATED"
	// ExecExit carries the final status; it is always the last event.
	ExecExit ExecEventKind = "EXIT"
)

// ExecEvent is one event of an exec's output stream.
type ExecEvent struct {
	Kind ExecEventKind
	// Cursor is the position after this event; pass it back as `after` to resume there.
	Cursor string
	// Stream is "stdout" or "stderr" for ExecChunk.
	Stream string
	Data   []byte
	// MissedBytes is, for ExecTruncated, how many log bytes were lost (0 when unknown): output
	// plus a 5-byte header per record of the sandbox's log.
	MissedBytes int64
	// Result is, for ExecExit, the exec's final status (without its output).
	Result *ExecResult
}

// ListOptions selects a page of the caller's sandboxes, newest first.
type ListOptions struct {
	// State filters by state when not empty.
	State State
	// After is the cursor of the last sandbox of the previous page.
	After string
	// Limit is the page size (default 50, at most 500).
	Limit int
	// Labels, when not empty, keeps only sandboxes that have every one of these labels with
	// its value (Limits.Selector builds it).
	Labels map[string]string
}

// Page is one page of sandboxes.
type Page struct {
	Sandboxes []Sandbox
	// NextCursor is the cursor of the next page, "" on the last page.
	NextCursor string
}

// DestroyResult answers a destroy.
type DestroyResult struct {
	Sandbox Sandbox
	// SnapshotID is the final checkpoint taken before the runtime was removed ("" when the
	// sandbox never had a workspace to keep).
	SnapshotID string
}

// FileInfo describes a file or folder in a sandbox's workspace.
type FileInfo struct {
	Name    string
	Path    string
	Size    int64
	Mode    uint32
	IsDir   bool
	Symlink string
	ModTime time.Time
	// Type is the kind of file (FileType…); empty when the sandbox's init is older.
	Type FileType
}

// Profile is a kind of sandbox a caller may create.
type Profile struct {
	Name        string
	Description string
	MilliCPU    int64
	MemoryBytes int64
	DiskBytes   int64
	Network     string
	// NetworkPolicy is the policy a create that does not narrow it gets (host names unresolved).
	NetworkPolicy NetworkPolicy
	Default       bool
}

// Event is a status change of a sandbox.
type Event struct {
	// Cursor orders events; pass it back as `after` to resume.
	Cursor        string
	Type          string
	SandboxID     string
	State         State
	PreviousState State
	Reason        string
	At            time.Time
	// Exec is the exec's status (without output) for EventExecStarted and EventExecEnded.
	Exec *ExecResult
	// BytesRead is, for EventBootstrapProgress, how many bytes of the source's workspace
	// stream were read so far.
	BytesRead int64
}

// Event types.
const (
	EventStateChanged = "STATE_CHANGED"
	// EventExecStarted and EventExecEnded follow commands; State is the sandbox's state as
	// the replica that published the event last saw it.
	EventExecStarted = "EXEC_STARTED"
	EventExecEnded   = "EXEC_ENDED"
	// EventBootstrapProgress reports a CREATING sandbox's bootstrap from an archive or a GCS
	// prefix (at most about once a second, and once when it begins): Reason is its
	// state_reason, BytesRead how far it is.
	EventBootstrapProgress = "BOOTSTRAP_PROGRESS"
	// EventUpdated says that an Update changed the sandbox: Reason names the fields it
	// changed ("labels", "autostop_sec", "ttl_sec", comma-separated); State is its state.
	EventUpdated = "SANDBOX_UPDATED"
)
