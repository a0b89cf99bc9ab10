package proto

import "time"

// File operations and watches (guest/server's fileops.go and watch.go). Every path is resolved
// the way the other file endpoints resolve it: symlinks in the parents are followed only
// within the workspace (one that leads out is ErrCodeInvalid), the last component is never
// followed, and every step acts on directory file descriptors opened without following a
// link, so a link a command swaps in between a check and the act is never followed.
//
//	GET    /v1/stat?path=P                     FileInfo (a symlink is reported as one: Type
//	                                           FileTypeSymlink, Symlink its target)
//	POST   /v1/mkdir?path=P                    MkdirResult: parents created; an existing
//	                                           directory is no error (Created false), anything
//	                                           else there is ErrCodeExists
//	POST   /v1/move                            MoveRequest → FileInfo of the new name
//	DELETE /v1/files?path=P&recursive=1        204; a non-empty directory without recursive is
//	                                           ErrCodeNotEmpty. With recursive a directory is
//	                                           moved aside at once (a hidden trash folder at the
//	                                           top of the workspace) and its entries removed in
//	                                           the background: the answer never waits for a
//	                                           large tree, and the name is free at once.
//	POST   /v1/watches                         WatchRequest → 201 WatchInfo
//	GET    /v1/watches/{id}/events?after=N&path=P&recursive=1
//	                                           the watch's events after sequence N, one JSON
//	                                           WatchEvent per line, followed live; the last line
//	                                           of a watch that ends is a WatchEnd event
//	DELETE /v1/watches/{id}                    204
const (
	// ErrCodeNotEmpty: a directory that is not empty, deleted without recursive (or a move
	// with overwrite onto one).
	ErrCodeNotEmpty = "not_empty"
	// ErrCodeGone: a watch that no longer exists (it expired after its grace period without
	// a reader, or the guest init restarted): a cursor naming it cannot be resumed.
	ErrCodeGone = "gone"
)

// Kinds of file (FileInfo.Type).
const (
	FileTypeFile      = "file"
	FileTypeDir       = "directory"
	FileTypeSymlink   = "symlink"
	FileTypeSocket    = "socket"
	FileTypeFIFO      = "fifo"
	FileTypeCharDev   = "char_device"
	FileTypeBlockDev  = "block_device"
	FileTypeIrregular = "other"
)

// MkdirResult is the answer of POST /v1/mkdir.
type MkdirResult struct {
	FileInfo
	// Created is false when the directory existed already.
	Created bool `json:"created"`
}

// MoveRequest is the body of POST /v1/move. From and To are workspace paths; To is the new
// name itself (never "into" a directory). Without Overwrite an existing To is ErrCodeExists;
// with it a file (or a symlink, never followed) or an empty directory there is replaced. The
// workspace itself, a directory into itself and From == To are ErrCodeInvalid.
//
// gVisor has no RENAME_NOREPLACE (renameat2 answers EINVAL): there the check that To does not
// exist and the rename are two steps, so a command that creates To in between has its new
// entry replaced (it is never followed). Kernels with the flag make it one step.
type MoveRequest struct {
	From      string `json:"from"`
	To        string `json:"to"`
	Overwrite bool   `json:"overwrite,omitempty"`
}

// WatchRequest is the body of POST /v1/watches: watch a directory of the workspace (inotify),
// its whole tree when Recursive (directories created later are watched too, and what they
// hold by then is reported by a scan).
type WatchRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
	// MaxDirs bounds the directories a recursive watch holds (0: DefaultWatchDirs, at most
	// MaxWatchDirs). A tree larger than that at the start is ErrCodeTooLarge; a directory
	// created beyond it later is not watched, and an EventOverflow (ReasonDirs) says which.
	MaxDirs int `json:"max_dirs,omitempty"`
	// MaxEvents bounds the ring of kept events (0: DefaultWatchEvents, at most MaxWatchEvents).
	MaxEvents int `json:"max_events,omitempty"`
	// GraceMs is how long the watch lives on after its last reader left (0: DefaultWatchGrace,
	// at most MaxWatchGrace): a reader that comes back in time resumes after its sequence.
	GraceMs int64 `json:"grace_ms,omitempty"`
	// MaxWatches refuses the watch with ErrCodeTooMany when this many watches (or the
	// server's own bound, whichever is lower) exist already; 0 means the server's bound.
	MaxWatches int `json:"max_watches,omitempty"`
}

// Bounds of a watch.
const (
	DefaultWatchDirs   = 4096
	MaxWatchDirs       = 65536
	DefaultWatchEvents = 4096
	MaxWatchEvents     = 65536
	// MaxWatchEventBytes bounds the bytes of the paths a watch's ring keeps; the oldest events
	// go first beyond it, as beyond MaxEvents.
	MaxWatchEventBytes = 1 << 20
	DefaultWatchGrace  = 60 * time.Second
	MaxWatchGrace      = time.Hour
	// MaxWatches is the server's own bound of watches at once.
	MaxWatches = 64
	// MaxWatchReaders bounds the readers of one watch at once; one more is ErrCodeTooMany.
	MaxWatchReaders = 8
	// WatchScanEntries bounds the entries one scan of a newly watched directory reports; the
	// rest is an EventOverflow (ReasonScan).
	WatchScanEntries = 10000
	// MaxWatchPath bounds the path (relative to the workspace) of a directory a recursive watch
	// adds: a deeper one is not watched (an EventOverflow, ReasonDirs), so that no event's path
	// is longer than MaxWatchPath plus one name, and one line of the event stream stays far
	// below what a reader takes, however deep a tree the workload makes.
	MaxWatchPath = 4096
	// WatchCoalesce is the window in which a file's modifications are one EventModified: the
	// first is reported at once, later ones in the window once at its end.
	WatchCoalesce = 200 * time.Millisecond
)

// WatchInfo is the answer of POST /v1/watches.
type WatchInfo struct {
	// ID names the watch (ASCII letters and digits).
	ID string `json:"id"`
	// Path is the watched directory, relative to the workspace ("." for the workspace).
	Path      string `json:"path"`
	Recursive bool   `json:"recursive"`
	// Dirs is how many directories are watched.
	Dirs int `json:"dirs"`
	// Seq is the sequence of the newest event (0 before the first): read after it.
	Seq uint64 `json:"seq"`
}

// Kinds of WatchEvent.
const (
	EventCreated  = "created"
	EventModified = "modified"
	EventDeleted  = "deleted"
	// EventMoved: Path was renamed from From (both in the watched tree; inotify paired them).
	// A rename out of the tree is EventDeleted, one into it EventCreated.
	EventMoved = "moved"
	// EventOverflow: events were lost; Reason says why, Missed how many when known (0:
	// unknown). A reader should rescan what it mirrors.
	EventOverflow = "overflow"
	// EventEnd is the last line of a watch that ended (Code, Message); no event follows.
	EventEnd = "end"
)

// Reasons of an EventOverflow.
const (
	// ReasonRing: the reader's position is older than the oldest event the ring keeps.
	ReasonRing = "ring"
	// ReasonQueue: the kernel's inotify queue overflowed (IN_Q_OVERFLOW).
	ReasonQueue = "queue"
	// ReasonDirs: a directory (Path) is not watched: the watch holds MaxDirs directories, or
	// the directory's path is longer than MaxWatchPath.
	ReasonDirs = "dirs"
	// ReasonScan: a newly watched directory (Path) holds more than WatchScanEntries entries;
	// only those were reported.
	ReasonScan = "scan"
)

// WatchEvent is one line of GET /v1/watches/{id}/events.
type WatchEvent struct {
	// Seq orders the watch's events from 1; resume after the last one read. An EventOverflow
	// of ReasonRing is not in the ring: its Seq is where the kept events resume.
	Seq  uint64 `json:"seq"`
	Kind string `json:"kind"`
	// Path is relative to the workspace, as From (EventMoved).
	Path  string    `json:"path,omitempty"`
	From  string    `json:"from,omitempty"`
	IsDir bool      `json:"is_dir,omitempty"`
	At    time.Time `json:"at"`
	// Missed and Reason describe an EventOverflow.
	Missed int64  `json:"missed,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Code (an ErrCode) and Message say why an EventEnd ended the watch.
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}
