package sandbox

import (
	"encoding/json"
	"time"
)

// What clients see of agent runs (internal/agents runs them): the start request, a run, and
// the events of a run's stream.

// AgentRunStatus is where an agent run is.
type AgentRunStatus string

// The agent run statuses. QUEUED → RUNNING → SUCCEEDED | FAILED | CANCELLED | TIMED_OUT (a run
// may also go from QUEUED to FAILED or CANCELLED directly).
const (
	RunQueued    AgentRunStatus = "QUEUED"
	RunRunning   AgentRunStatus = "RUNNING"
	RunSucceeded AgentRunStatus = "SUCCEEDED"
	RunFailed    AgentRunStatus = "FAILED"
	RunCancelled AgentRunStatus = "CANCELLED"
	RunTimedOut  AgentRunStatus = "TIMED_OUT"
)

// Terminal reports whether the status is final.
func (s AgentRunStatus) Terminal() bool {
	return s == RunSucceeded || s == RunFailed || s == RunCancelled || s == RunTimedOut
}

// AgentRunRequest starts an agent run.
type AgentRunRequest struct {
	AgentID     string
	Model       string
	Instruction string
	SandboxID   string
	// PassAtK is the number of independent attempts (0 or 1: one). More is refused with a
	// sandbox: graded attempts do not attach to one.
	PassAtK int
	// Config is the agent's config: a JSON object, or empty.
	Config json.RawMessage
}

// AgentRun is what clients see of one agent run.
type AgentRun struct {
	ID        string
	SandboxID string
	AgentID   string
	Model     string
	Status    AgentRunStatus
	// Reason says why a run FAILED (or how it ended otherwise), "" when there is nothing to say.
	Reason string
	// ExecID is the exec the agent runs as ("" when it never started); its output is the run's.
	ExecID string
	// ExitCode and Signal are the agent's exit, meaningful once the run is final and ran.
	ExitCode int
	Signal   string
	// RunDir is the run's folder in the workspace: instruction.md and config.json.
	RunDir    string
	CreatedAt time.Time
	StartedAt time.Time
	EndedAt   time.Time
}

// AgentRunEventKind says what an AgentRunEvent carries.
type AgentRunEventKind string

// The agent run event kinds.
const (
	// AgentRunStatusEvent carries the run's status (Run): the first event, and the last once
	// the run is final.
	AgentRunStatusEvent AgentRunEventKind = "STATUS"
	// AgentRunChunk carries agent output (Stream, Data).
	AgentRunChunk AgentRunEventKind = "CHUNK"
	// AgentRunTruncated says output before Cursor was dropped (MissedBytes).
	AgentRunTruncated AgentRunEventKind = "TRUNCATED"
)

// AgentRunEvent is one event of a run's stream.
type AgentRunEvent struct {
	Kind AgentRunEventKind
	// Cursor is the position in the run's output after this event: pass it back as `after`.
	Cursor      string
	Run         *AgentRun
	Stream      string
	Data        []byte
	MissedBytes int64
}

// AgentRunListOptions asks for one page of a sandbox's agent runs.
type AgentRunListOptions struct {
	// Limit is the page size: 1 to the runs kept per sandbox (0: 50).
	Limit int
	// After is the id of the last run of the previous page ("": the first page).
	After string
}

// AgentRunPage is one page of agent runs, newest first.
type AgentRunPage struct {
	Runs []AgentRun
	// NextCursor is the cursor of the next page (the last run's id), "" on the last page.
	NextCursor string
}
