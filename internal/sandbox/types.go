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
	Network          string
}

// ExpiresAt is when the sandbox's TTL ends (zero when it has none).
func (s Sandbox) ExpiresAt() time.Time { return ExpiresAt(s.CreatedAt, s.TTLSec) }

// CreateRequest creates a sandbox. Nil fields take the configured defaults.
type CreateRequest struct {
	Profile     string
	AutostopSec *int64
	TTLSec      *int64
	Env         map[string]string
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
}

// ExecResult is the collected result of a finished exec.
type ExecResult struct {
	ExecID   string
	ExitCode int
	// Signal names the signal that ended the command ("SIGKILL"), "" when it exited.
	Signal          string
	TimedOut        bool
	Duration        time.Duration
	StartedAt       time.Time
	EndedAt         time.Time
	Stdout          []byte
	Stderr          []byte
	StdoutTruncated bool
	StderrTruncated bool
	// Error says why the command could not start, if so.
	Error string
}

// ListOptions selects a page of the caller's sandboxes, newest first.
type ListOptions struct {
	// State filters by state when not empty.
	State State
	// After is the cursor of the last sandbox of the previous page.
	After string
	// Limit is the page size (default 50, at most 500).
	Limit int
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
}

// Profile is a kind of sandbox a caller may create.
type Profile struct {
	Name        string
	Description string
	MilliCPU    int64
	MemoryBytes int64
	DiskBytes   int64
	Network     string
	Default     bool
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
}

// Event types.
const (
	EventStateChanged = "STATE_CHANGED"
)
