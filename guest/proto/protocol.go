// Package proto is the guest init's wire protocol, what both ends of the attach stream share:
// the server that runs as PID 1 inside every sandbox (guest/server, cmd/sandbox-init) and the
// client the control plane uses over a driver's Attach stream (guest/client). The wire is
// HTTP/2 (h2c, prior knowledge) over that one byte stream, so many calls share one attach;
// before it, the stream carries the ConnectReady byte and the channel handshake (channel.go).
// An attach may instead carry exec streams (stream.go): one exec start and its log at a time,
// with no HTTP/2 between, for runtimes whose attach is a local connect.
//
// Endpoints (JSON bodies; every non-2xx answer carries an Error with a stable code):
//
//	GET    /v1/health                          Health
//	POST   /v1/execs                           ExecRequest → 201 ExecInfo
//	POST   /v1/execs?follow=1                  ExecRequest → 201 and the log, as below
//	GET    /v1/execs                           []ExecInfo, oldest first
//	GET    /v1/execs/{id}                      ExecInfo
//	DELETE /v1/execs/{id}                      204: an ended exec forgotten as if it never ran
//	                                           (what it left running killed, record, log and
//	                                           cgroup gone); ErrCodeState while it runs
//	GET    /v1/execs/{id}/log?offset=N&follow=1  raw log records from a record boundary
//	                                           (RecordTruncated first when N is no longer kept)
//	POST   /v1/execs/{id}/signal               SignalRequest → ExecInfo (the whole tree)
//	POST   /v1/execs/{id}/stdin?close=1        raw bytes → StdinResult (an exec started with
//	                                           StdinOpen or Tty only; all bytes or none)
//	POST   /v1/execs/{id}/resize               TtySize → ExecInfo (an exec started with Tty only)
//	GET    /v1/files?path=P                    the bytes; HeaderSize, HeaderMode, HeaderModTime
//	PUT    /v1/files?path=P&mode=0644&max=N    body → FileInfo (atomic, parents created)
//	DELETE /v1/files?path=P&recursive=1        204
//	… stat, mkdir, move and watches: files.go
//	GET    /v1/dirs?path=P&limit=N             DirListing
//	GET    /v1/dirs?path=P&limit=N&order=name&after=NAME
//	                                           DirListing, Ordered: the first N entries whose
//	                                           names sort after NAME (byte order)
//	GET    /v1/workspace/tar                   the workspace as tar; trailer HeaderFiles
//	PUT    /v1/workspace/tar?replace=1&max_bytes=N&max_files=N&external_symlinks=1
//	                                           tar body → ImportResult
//	POST   /v1/quiesce                         QuiesceResult (pause.go)
//	PUT    /v1/env                             EnvRequest → EnvResult (env.go)
//
// Paths are relative to the workspace or absolute under /workspace; anything that resolves
// outside it (.., symlinks) is ErrCodeInvalid.
package proto

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strings"
	"time"
)

// Paths inside the sandbox.
const (
	// InitPath is where the guest init binary is mounted read-only in every sandbox.
	InitPath = "/.sbx/init"
	// SocketPath is the unix socket PID 1 listens on; `init connect` bridges stdio to it. It
	// is abstract (no file): nothing in the box can unlink, replace or link it, and binding the
	// name a second time fails while PID 1 holds it.
	SocketPath = "@sbx-init"
	// HostSocketEnv names a second socket PID 1 listens on when set: a runtime that mounts a
	// host folder there (with runsc --host-uds=create) attaches by dialing it from the host,
	// with no `runsc exec` at all. Each connection on it starts with the ConnectReady byte.
	HostSocketEnv = "SBX_HOST_SOCKET"
	// StateDir holds each exec's output log and status (a tmpfs inside the sandbox).
	StateDir = "/run/sbx/execs"
	// Workspace is the sandbox's persistent working directory.
	Workspace = "/workspace"
	// ExecIDEnv is set in every exec's environment, as information for the command only: the
	// init never uses it to find an exec's processes (a command can drop it).
	ExecIDEnv = "SBX_EXEC_ID"
)

// ExecRequest starts a command inside the sandbox.
type ExecRequest struct {
	// ID is chosen by the control plane (exec_…); starting an id twice is an error.
	ID   string   `json:"id"`
	Argv []string `json:"argv"`
	// Env entries KEY=VALUE are added to the sandbox's base environment.
	Env []string `json:"env,omitempty"`
	// Cwd defaults to /workspace.
	Cwd string `json:"cwd,omitempty"`
	// Timeout kills the whole process tree after this long; 0 means no timeout.
	TimeoutMs int64 `json:"timeout_ms,omitempty"`
	// Stdin is written to the command's stdin, which is then closed. Empty means /dev/null
	// (unless StdinOpen or Tty is set). With StdinOpen or Tty it is the first content of the
	// exec's stdin buffer (it may fill it past StdinBufferBytes: later writes then wait for
	// room).
	Stdin []byte `json:"stdin,omitempty"`
	// StdinOpen keeps the command's stdin open after Stdin (a pipe): more bytes come through
	// POST /v1/execs/{id}/stdin, and stdin closes when a call asks for it (close=1: the
	// command reads EOF once the buffer drained), when the command closed its end, or when it
	// ends (its main process exited; bytes it left unread are dropped).
	StdinOpen bool `json:"stdin_open,omitempty"`
	// Tty runs the command under a pseudo-terminal of this size, as the session leader with
	// the terminal as its controlling one: stdin, stdout and stderr are the terminal, its
	// output is one stream (RecordStdout records, counted in StdoutBytes), its input comes
	// from Stdin and then POST /v1/execs/{id}/stdin (a Tty exec's stdin is always open).
	// Closing a terminal's stdin types its end-of-file character (VEOF) when it is in
	// canonical mode (twice when the last byte typed left a line open) and nothing in raw
	// mode; no bytes are taken afterwards. The exec ends when the session leader exits, as a
	// pipe exec ends with its main process: the output is read until nothing holds the
	// terminal open or for a second at most, then the terminal is hung up (what the command
	// left running gets SIGHUP, and EIO on the terminal); a signal to the ended exec still
	// reaches those processes. Nil means pipes.
	Tty *TtySize `json:"tty,omitempty"`
	// MaxLogBytes bounds the output log kept inside the sandbox; 0 means the server default.
	MaxLogBytes int64 `json:"max_log_bytes,omitempty"`
	// MaxRunning refuses the exec with ErrCodeTooMany when this many execs (or the server's own
	// bound, whichever is lower) are running already; 0 means the server's bound only.
	MaxRunning int `json:"max_running,omitempty"`
}

// ExecInfo is the state of one exec.
type ExecInfo struct {
	ID        string    `json:"id"`
	Argv      []string  `json:"argv"`
	Pid       int       `json:"pid"`
	StartedAt time.Time `json:"started_at"`
	// Running is true until the exit record has been written.
	Running bool `json:"running"`
	// LogBytes is the size of the output log so far (the offset a follower has to reach).
	LogBytes int64 `json:"log_bytes"`
	// Exit is set once the command has ended.
	Exit *ExitStatus `json:"exit,omitempty"`
	// StdinOpen is true while the exec's stdin can still be written (StdinOpen or Tty, not yet
	// closed by a call or by the command, the command running).
	StdinOpen bool `json:"stdin_open,omitempty"`
	// Tty is the terminal's current size for an exec started with one.
	Tty *TtySize `json:"tty,omitempty"`
}

// TtySize is a terminal's size in character cells.
type TtySize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// Bounds of a terminal's size: a TtySize outside them is ErrCodeInvalid.
const (
	MinTtyCells = 1
	MaxTtyCells = 1000
)

// Valid reports whether both dimensions are within MinTtyCells..MaxTtyCells.
func (t TtySize) Valid() bool {
	return t.Rows >= MinTtyCells && t.Rows <= MaxTtyCells && t.Cols >= MinTtyCells && t.Cols <= MaxTtyCells
}

// Stdin bounds: one POST /v1/execs/{id}/stdin carries at most MaxStdinWrite bytes (a larger
// body is ErrCodeTooLarge, nothing written), and each exec buffers at most StdinBufferBytes
// that the command has not read yet; a write that does not fit in what is left of the buffer
// is refused whole with ErrCodeUnavailable (nothing written: retry after the command read).
const (
	MaxStdinWrite    = 1 << 20
	StdinBufferBytes = 1 << 20
)

// StdinResult is the answer of POST /v1/execs/{id}/stdin.
type StdinResult struct {
	// Written is how many bytes of the body were taken (all of them).
	Written int64 `json:"written"`
	// Buffered is how many bytes wait in the exec's stdin buffer, this write's included: not
	// yet passed into the pipe or terminal (which hold some more the command has not read).
	Buffered int64 `json:"buffered"`
	// Closed is true when stdin is closed now (this call asked for it, or the command ended).
	Closed bool `json:"closed"`
}

// ExitStatus is the final status of an exec.
type ExitStatus struct {
	// ExitCode is the process's exit code, 128+n when it was killed by signal n. A command that
	// could not start reports it the way a shell does: 127 (not found, bad cwd) or 126 (not
	// executable), with Error set.
	ExitCode int `json:"exit_code"`
	// Signal names the signal that killed it ("SIGKILL"), empty when it exited.
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out"`
	// DurationMs is the wall time from start to exit.
	DurationMs int64     `json:"duration_ms"`
	EndedAt    time.Time `json:"ended_at"`
	// Error says why the command could not start ("executable file not found"), if so.
	Error string `json:"error,omitempty"`
	// DroppedBytes counts output the log no longer holds: the oldest records, dropped to keep
	// the log within MaxLogBytes, and output lost to a failed write (readers got a
	// RecordTruncated for it, where it was).
	DroppedBytes int64 `json:"dropped_bytes,omitempty"`
	// StdoutBytes and StderrBytes count every byte the command wrote to each, kept in the log
	// or not. (An init older than these fields reports neither, and its DroppedBytes were the
	// newest output: it dropped the end once its log was full.)
	StdoutBytes int64 `json:"stdout_bytes,omitempty"`
	StderrBytes int64 `json:"stderr_bytes,omitempty"`
}

// Output log records. The log of an exec is a sequence of records, each a 5-byte header (one
// kind byte, then the payload length as a big-endian uint32) followed by the payload. Offsets
// are logical byte offsets into this log: they count every record ever appended, grow
// monotonically and are never reused, and a record never straddles a read from a record
// boundary.
//
// The log keeps the newest output. It is stored as segment files; once the kept records pass
// the exec's MaxLogBytes the oldest segments are dropped (and a failed write to the state dir
// leaves a gap), while the exit record is always kept. A reader whose offset is no longer kept
// (it asked for it, or it fell behind while following) first gets a RecordTruncated and then
// the records from the oldest kept record boundary after its offset; a follower that holds a
// segment open reads it to its end even after it was dropped.
const (
	RecordStdout byte = 1
	RecordStderr byte = 2
	// RecordExit's payload is the JSON ExitStatus; it is always the last record.
	RecordExit byte = 3
	// RecordTruncated is not part of the log: the server sends it to a reader whose position is
	// no longer kept. Its payload (TruncatedPayloadLen bytes) is the logical offset, as a
	// big-endian uint64, where the kept log resumes: the next record starts there, and the
	// log bytes from the reader's offset up to it (records, headers included) are lost. It
	// does not advance the offset by its own length: a reader resumes at the payload's offset.
	RecordTruncated byte = 4
	// TruncatedPayloadLen is the payload length of a RecordTruncated.
	TruncatedPayloadLen = 8
	// RecordHeaderLen is the size of a record header.
	RecordHeaderLen = 5
	// MaxRecordPayload bounds one record's payload.
	MaxRecordPayload = 64 << 10
)

// UnixMode converts Go's mode bits into FileInfo.Mode (the encoding of the mode parameter of
// PUT /v1/files too).
func UnixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}

// FileInfo describes one file or directory inside the sandbox.
type FileInfo struct {
	Name string `json:"name"`
	// Path is relative to /workspace for listings, absolute otherwise.
	Path string `json:"path"`
	Size int64  `json:"size"`
	// Mode holds the Unix permission bits (0o777) plus setuid 0o4000, setgid 0o2000 and
	// sticky 0o1000; IsDir and Symlink say what kind of file it is.
	Mode    uint32    `json:"mode"`
	IsDir   bool      `json:"is_dir"`
	Symlink string    `json:"symlink,omitempty"`
	ModTime time.Time `json:"mod_time"`
	// Type is the kind of file (FileType…, files.go); empty from an older init.
	Type string `json:"type,omitempty"`
}

// Error is the JSON body of every non-2xx answer from the guest init.
type Error struct {
	// Code is one of the ErrCode constants.
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error codes the guest init answers with.
const (
	ErrCodeNotFound    = "not_found"
	ErrCodeInvalid     = "invalid"
	ErrCodeExists      = "exists"
	ErrCodeTooLarge    = "too_large"
	ErrCodeIsDir       = "is_dir"
	ErrCodeNotDir      = "not_dir"
	ErrCodeInternal    = "internal"
	ErrCodeUnavailable = "unavailable"
	// ErrCodeNoSpace: the workspace's disk is full (ENOSPC/EDQUOT: the sandbox's disk limit).
	ErrCodeNoSpace = "no_space"
	// ErrCodeTooMany: as many execs as the request's MaxRunning allows are running already.
	ErrCodeTooMany = "too_many"
	// ErrCodeState: the exec is not in a state the call needs: stdin of an exec without open
	// stdin, or already closed, or ended; resize of an exec without a terminal.
	ErrCodeState = "invalid_state"
)

// Health is the answer of GET /v1/health.
type Health struct {
	OK      bool   `json:"ok"`
	Pid     int    `json:"pid"`
	Version string `json:"version"`
	// ProcessTracking says how the init finds an exec's processes for a timeout, signal or
	// shutdown: TrackingCgroup or TrackingProcessGroup (empty from an older init).
	ProcessTracking string `json:"process_tracking,omitempty"`
	// ExecStreams says that the init serves exec streams (stream.go); false from an older one.
	ExecStreams bool `json:"exec_streams,omitempty"`
	// SpawnerPid is the pid of the spawner program that starts the commands (0: PID 1 forks
	// them itself), and SpawnerStarts how many commands it started.
	SpawnerPid    int    `json:"spawner_pid,omitempty"`
	SpawnerStarts uint64 `json:"spawner_starts,omitempty"`
}

// Values of Health.ProcessTracking.
const (
	// TrackingCgroup: each exec has a cgroup of its own, which every process it starts stays
	// in; all of them are reached, whatever they do.
	TrackingCgroup = "cgroup"
	// TrackingProcessGroup: the exec's process group and the live descendants of its
	// processes; a process that left the group and was re-parented is missed.
	TrackingProcessGroup = "process-group"
)

// SignalRequest is the body of POST /v1/execs/{id}/signal.
type SignalRequest struct {
	// Signal is one of SIGTERM, SIGKILL, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2.
	Signal string `json:"signal"`
}

// DirListing is the answer of GET /v1/dirs.
type DirListing struct {
	Entries []FileInfo `json:"entries"`
	// Truncated is true when the directory holds more entries than the limit (with
	// order=name: more entries after the last one answered).
	Truncated bool `json:"truncated"`
	// Ordered is true when the answer is a page in name order (order=name): the entries are
	// the smallest names after the asked one. An init that predates order=name leaves it false.
	Ordered bool `json:"ordered,omitempty"`
}

// MaxNameBytes is the longest name a folder entry can have (Linux NAME_MAX).
const MaxNameBytes = 255

// ValidEntryName reports whether name can be one entry of a folder: not empty, not . or ..,
// at most MaxNameBytes bytes, without '/' or NUL. A listing's after must be one.
func ValidEntryName(name string) bool {
	return name != "" && name != "." && name != ".." && len(name) <= MaxNameBytes &&
		!strings.ContainsAny(name, "/\x00")
}

// ImportResult is the answer of PUT /v1/workspace/tar.
type ImportResult struct {
	Files int64 `json:"files"`
	Bytes int64 `json:"bytes"`
}

// Headers of file and tar answers.
const (
	// HeaderSize is the file's size in bytes (GET /v1/files).
	HeaderSize = "X-Sbx-Size"
	// HeaderMode is the file's FileInfo.Mode in octal, e.g. "0644" (GET /v1/files).
	HeaderMode = "X-Sbx-Mode"
	// HeaderModTime is the file's modification time, RFC 3339 with nanoseconds (GET /v1/files).
	HeaderModTime = "X-Sbx-Mtime"
	// HeaderFiles is a trailer of GET /v1/workspace/tar: how many entries the tar holds.
	HeaderFiles = "X-Sbx-Files"
	// HeaderLogBytes is the log size when a log answer started (GET /v1/execs/{id}/log).
	HeaderLogBytes = "X-Sbx-Log-Bytes"
)

// Error implements error.
func (e *Error) Error() string {
	return fmt.Sprintf("guest: %s: %s", e.Code, e.Message)
}

// HTTPStatus is the status the guest init answers with for an error code.
func HTTPStatus(code string) int {
	switch code {
	case ErrCodeNotFound:
		return http.StatusNotFound
	case ErrCodeInvalid, ErrCodeIsDir, ErrCodeNotDir:
		return http.StatusBadRequest
	case ErrCodeExists, ErrCodeState:
		return http.StatusConflict
	case ErrCodeNotEmpty:
		return http.StatusConflict
	case ErrCodeGone:
		return http.StatusGone
	case ErrCodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case ErrCodeNoSpace:
		return http.StatusInsufficientStorage
	case ErrCodeUnavailable:
		return http.StatusTooManyRequests
	default:
		return http.StatusInternalServerError
	}
}

// ConnectReady is the one byte `init connect` writes to its stdout once it has reached PID 1's
// socket, before any protocol byte. A driver reads it (AwaitReady) before handing the stream on:
// its arrival means the guest init is up, so a fresh box's readiness costs no extra attach.
const ConnectReady byte = 0x06

// NoSpaceMessage begins the message of an error caused by a full workspace disk (ENOSPC or
// EDQUOT: the sandbox's disk limit), whose code is ErrCodeNoSpace.
const NoSpaceMessage = "the workspace disk is full"

// IsNoSpace reports whether err is the guest's answer to a full workspace disk.
func IsNoSpace(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == ErrCodeNoSpace
}
