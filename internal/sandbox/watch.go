package sandbox

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
)

// File watches. The watch itself lives in the sandbox's guest init (inotify, a bounded ring of
// sequenced events, kept for a grace period after its last reader), so the cursor of an event,
// "<watch id>.<sequence>", means the same on every replica: a client that reconnects to any of
// them resumes right after its last event. This side follows the guest's events, converts
// them, and when its attach breaks reattaches and goes on after the last sequence it passed.

// FileEventKind is what a FileEvent reports.
type FileEventKind string

// Kinds of FileEvent.
const (
	FileCreated  FileEventKind = "CREATED"
	FileModified FileEventKind = "MODIFIED"
	FileDeleted  FileEventKind = "DELETED"
	// FileMoved: Path was renamed from From, both inside the watched tree.
	FileMoved FileEventKind = "MOVED"
	// FileOverflow: events were lost (Reason, Missed when known); rescan what you mirror.
	FileOverflow FileEventKind = "OVERFLOW"
	// FileWatchError ends the stream: Code and Message say why. Nothing follows it.
	FileWatchError FileEventKind = "ERROR"
)

// Reasons of a FileOverflow.
const (
	// OverflowRing: the cursor is older than the events the watch keeps.
	OverflowRing = "RING"
	// OverflowQueue: the kernel's inotify queue overflowed.
	OverflowQueue = "QUEUE"
	// OverflowDirs: a directory (Path) is not watched: the watch holds limits.watch_max_dirs.
	OverflowDirs = "DIRS"
	// OverflowScan: a new directory (Path) held more entries than its scan reports.
	OverflowScan = "SCAN"
)

// FileEvent is one event of a file watch.
type FileEvent struct {
	// Cursor is the position after this event; resume with it as After, on any replica.
	Cursor string
	Kind   FileEventKind
	// Path (and From, for FileMoved) are relative to /workspace.
	Path  string
	From  string
	IsDir bool
	At    time.Time
	// Missed and Reason describe a FileOverflow (Missed 0: unknown).
	Missed int64
	Reason string
	// Code and Message say why a FileWatchError ended the stream.
	Code    apierror.Code
	Message string
}

// WatchRequest asks for a file watch.
type WatchRequest struct {
	// Path is the watched directory ("" or "." is the workspace).
	Path string
	// Recursive watches the whole tree below Path, directories made later included.
	Recursive bool
	// After resumes after the cursor of an event ("": a new watch, from now on).
	After string
}

// watchReopen bounds how long a follower whose attach broke tries to reattach.
const watchReopen = 30 * time.Second

// WatchFiles follows changes below a directory of the workspace: created, modified (coalesced),
// deleted and moved files and folders, from now on or after a cursor. A cursor that names a
// watch that is gone (it expired, or the sandbox restarted) is CURSOR_EXPIRED; one of another
// path or recursion, or a malformed one, INVALID_ARGUMENT. The channel closes when ctx ends or
// after a FileWatchError event (the stream never just stops).
func (s *Service) WatchFiles(ctx context.Context, p auth.Principal, id string, req WatchRequest) (<-chan FileEvent, error) {
	if req.Path == "" {
		req.Path = "."
	}
	if err := s.cfg.Limits.checkPath(req.Path); err != nil {
		return nil, err
	}
	var watchID string
	var seq uint64
	if req.After != "" {
		var ok bool
		if watchID, seq, ok = parseWatchCursor(req.After); !ok {
			return nil, apierror.New(apierror.InvalidArgument, "malformed cursor %q", apierror.Truncate(req.After, 64)).WithDetail("field", "after")
		}
	}
	g, err := s.filesGuest(ctx, p, id)
	if err != nil {
		return nil, err
	}
	release, err := s.HoldStream(p)
	if err != nil {
		return nil, err
	}
	if watchID == "" {
		l := s.cfg.Limits
		info, err := g.Watch(ctx, proto.WatchRequest{Path: req.Path, Recursive: req.Recursive, MaxDirs: l.WatchMaxDirs,
			MaxEvents: l.WatchMaxEvents, GraceMs: int64(l.WatchGraceSec) * 1000, MaxWatches: l.WatchMaxPerSandbox})
		if err != nil {
			release()
			return nil, s.fileOpError(ctx, id, err)
		}
		watchID, seq = info.ID, info.Seq
	}
	r, err := g.WatchEvents(ctx, watchID, seq, req.Path, req.Recursive)
	if err != nil {
		release()
		return nil, s.fileOpError(ctx, id, err)
	}
	out := make(chan FileEvent)
	f := &watchFollower{s: s, p: p, id: id, req: req, watchID: watchID, seq: seq, out: out}
	go func() {
		defer release()
		defer close(out)
		f.follow(ctx, r)
	}()
	return out, nil
}

// watchMaxStalls is how many reattaches in a row may read nothing before a watch's stream
// ends with an error.
const watchMaxStalls = 3

// watchFollower copies one watch's events to a subscriber.
type watchFollower struct {
	s       *Service
	p       auth.Principal
	id      string
	req     WatchRequest
	watchID string
	seq     uint64 // the last sequence passed on
	out     chan<- FileEvent
}

func (f *watchFollower) follow(ctx context.Context, r *client.WatchReader) {
	stalled := 0 // reopens in a row after which nothing could be read
	for {
		ev, err := r.Next()
		if err == nil {
			stalled = 0
			if !f.send(ctx, f.event(ev)) || ev.Kind == proto.EventEnd {
				r.Close()
				return
			}
			f.seq = max(f.seq, ev.Seq)
			continue
		}
		r.Close()
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, io.EOF) {
			return // after the end event, passed on already
		}
		// A stream that breaks again and again at the same place (an event this side cannot
		// read) must not turn into a loop of reattaches: back off, and after a few give up
		// with an error the subscriber sees.
		if stalled++; stalled > watchMaxStalls {
			f.send(ctx, FileEvent{Cursor: f.cursor(f.seq), Kind: FileWatchError, Code: apierror.Unavailable,
				Message: "the watch's events cannot be read after " + apierror.Truncate(f.cursor(f.seq), 64) + ": " + apierror.Truncate(err.Error(), 200),
				At:      time.Now().UTC()})
			return
		}
		if stalled > 1 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(stalled) * 200 * time.Millisecond):
			}
		}
		r, err = f.reopen(ctx)
		if err != nil {
			if ctx.Err() == nil {
				e := apierror.From(err)
				f.send(ctx, FileEvent{Cursor: f.cursor(f.seq), Kind: FileWatchError, Code: e.Code, Message: e.Message, At: time.Now().UTC()})
			}
			return
		}
	}
}

// reopen reattaches after the last sequence: the sandbox must still be running (else its
// state is the error), the watch must still exist (else CURSOR_EXPIRED); an attach that
// cannot be made is retried for a while.
func (f *watchFollower) reopen(ctx context.Context) (*client.WatchReader, error) {
	deadline := time.Now().Add(watchReopen)
	wait := 100 * time.Millisecond
	for {
		g, err := f.s.filesGuest(ctx, f.p, f.id)
		if err == nil {
			var r *client.WatchReader
			r, err = g.WatchEvents(ctx, f.watchID, f.seq, f.req.Path, f.req.Recursive)
			if err == nil {
				return r, nil
			}
			err = f.s.fileOpError(ctx, f.id, err)
		}
		if !apierror.Is(err, apierror.Unavailable) || time.Now().After(deadline) {
			return nil, err
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		wait = min(2*wait, 2*time.Second)
	}
}

func (f *watchFollower) send(ctx context.Context, ev FileEvent) bool {
	select {
	case f.out <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

func (f *watchFollower) cursor(seq uint64) string {
	return f.watchID + "." + strconv.FormatUint(seq, 10)
}

// event converts one of the guest's events.
func (f *watchFollower) event(ev proto.WatchEvent) FileEvent {
	out := FileEvent{Cursor: f.cursor(ev.Seq), Path: ev.Path, From: ev.From, IsDir: ev.IsDir, At: ev.At, Missed: ev.Missed}
	switch ev.Kind {
	case proto.EventCreated:
		out.Kind = FileCreated
	case proto.EventModified:
		out.Kind = FileModified
	case proto.EventDeleted:
		out.Kind = FileDeleted
	case proto.EventMoved:
		out.Kind = FileMoved
	case proto.EventOverflow:
		out.Kind, out.Reason = FileOverflow, strings.ToUpper(ev.Reason)
	case proto.EventEnd:
		out.Kind, out.Message = FileWatchError, ev.Message
		switch ev.Code {
		case proto.ErrCodeNotFound:
			out.Code = apierror.NotFound
		case proto.ErrCodeGone:
			out.Code = apierror.CursorExpired
		default:
			out.Code = apierror.Internal
		}
	default:
		out.Kind, out.Reason = FileOverflow, "UNKNOWN_EVENT"
	}
	return out
}

// parseWatchCursor parses "<watch id>.<sequence>": the id "w" and 16 lowercase hex digits.
func parseWatchCursor(c string) (string, uint64, bool) {
	id, n, ok := strings.Cut(c, ".")
	if !ok || len(id) != 17 || id[0] != 'w' {
		return "", 0, false
	}
	for _, r := range id[1:] {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
			return "", 0, false
		}
	}
	seq, err := strconv.ParseUint(n, 10, 64)
	if err != nil || strconv.FormatUint(seq, 10) != n {
		return "", 0, false
	}
	return id, seq, true
}
