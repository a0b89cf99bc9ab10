package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// File operations besides read, write and list (sandboxes.go): stat, mkdir, move, delete, and
// file watches over REST (WatchFiles) and GraphQL (SubscribeWatchFiles), both resumed after
// the last cursor when the connection drops.

// Codes of the file operations (besides those of client.go).
const (
	CodeDirectoryNotEmpty = "DIRECTORY_NOT_EMPTY"
	CodeCursorExpired     = "CURSOR_EXPIRED"
)

// Stat describes a path of the workspace without following a symlink at its end (a link is
// reported with Type "SYMLINK" and its target in Symlink).
func (c *Client) Stat(ctx context.Context, id, path string) (FileInfo, error) {
	var fi FileInfo
	err := c.call(ctx, http.MethodGet, withQuery(sandboxPath(id, "files", "stat"), url.Values{"path": {path}}), nil, &fi)
	return fi, err
}

// MakeDir makes a directory and its missing parents; created is false when it existed.
func (c *Client) MakeDir(ctx context.Context, id, path string) (fi FileInfo, created bool, err error) {
	var out struct {
		FileInfo
		Created bool `json:"created"`
	}
	err = c.call(ctx, http.MethodPost, withQuery(sandboxPath(id, "files", "mkdir"), url.Values{"path": {path}}), nil, &out)
	return out.FileInfo, out.Created, err
}

// MoveFile renames from to to (the new name itself); an existing to is ALREADY_EXISTS unless
// overwrite.
func (c *Client) MoveFile(ctx context.Context, id, from, to string, overwrite bool) (FileInfo, error) {
	var fi FileInfo
	body := map[string]any{"from": from, "to": to, "overwrite": overwrite}
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "files", "move"), body, &fi)
	return fi, err
}

// DeleteFile deletes a file, a symlink or an empty directory; a full directory only with
// recursive (else DIRECTORY_NOT_EMPTY).
func (c *Client) DeleteFile(ctx context.Context, id, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	return c.call(ctx, http.MethodDelete, withQuery(sandboxPath(id, "files"), q), nil, nil)
}

// Kinds of FileEvent.
const (
	FileCreated  = "CREATED"
	FileModified = "MODIFIED"
	FileDeleted  = "DELETED"
	FileMoved    = "MOVED"    // From holds the old path
	FileOverflow = "OVERFLOW" // events were lost (Reason, Missed): rescan
)

// FileEvent is one event of a file watch. Paths are relative to /workspace.
type FileEvent struct {
	Cursor string
	Kind   string
	Path   string
	From   string
	IsDir  bool
	At     time.Time
	// Missed and Reason describe a FileOverflow (Missed 0: unknown).
	Missed int64
	Reason string
}

// WatchOptions are a watch's options.
type WatchOptions struct {
	// Recursive watches the whole tree below the path.
	Recursive bool
	// After resumes after a cursor ("": a new watch, from now on).
	After string
}

// FileWatch is a REST file watch (Server-Sent Events). When the connection drops it
// reconnects after the last cursor seen (with backoff), so the events it answers have no gap
// and no duplicate. It lives until an error ends it, the end of its context, or Close. Not
// safe for concurrent use.
type FileWatch struct {
	c      *Client
	ctx    context.Context
	path   string // the GET path and query without after
	cursor string
	body   io.ReadCloser
	rd     *bufio.Reader
	done   bool
}

// WatchFiles watches a directory of the workspace ("" or "." is /workspace). The server's
// refusal (NOT_FOUND, CURSOR_EXPIRED, LIMIT_EXCEEDED…) is the error; then Next answers events.
func (c *Client) WatchFiles(ctx context.Context, id, path string, opts WatchOptions) (*FileWatch, error) {
	q := url.Values{}
	if path != "" {
		q.Set("path", path)
	}
	if opts.Recursive {
		q.Set("recursive", "true")
	}
	w := &FileWatch{c: c, ctx: ctx, path: withQuery(sandboxPath(id, "files", "watch"), q), cursor: opts.After}
	if err := w.open(); err != nil {
		return nil, err
	}
	return w, nil
}

// Cursor is the cursor of the last event answered (or the first After).
func (w *FileWatch) Cursor() string { return w.cursor }

// Close ends the watch's stream (the sandbox keeps the watch for its grace period, so a new
// WatchFiles with After: Cursor() resumes it).
func (w *FileWatch) Close() error {
	w.done = true
	if w.body != nil {
		err := w.body.Close()
		w.body = nil
		return err
	}
	return nil
}

func (w *FileWatch) open() error {
	req, err := w.c.request(w.ctx, http.MethodGet, w.path, nil)
	if err != nil {
		return err
	}
	if w.cursor != "" {
		req.Header.Set("Last-Event-ID", w.cursor)
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := w.c.send(req)
	if err != nil {
		return err
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		resp.Body.Close()
		return fmt.Errorf("client: GET %s answered %q, want text/event-stream", w.path, ct)
	}
	w.body, w.rd = resp.Body, bufio.NewReaderSize(resp.Body, 64<<10)
	return nil
}

// Next answers the next event. A watch that cannot go on (its folder was deleted, the sandbox
// stopped, its watch expired) ends with the server's *Error; after it, and after Close, Next
// answers io.EOF.
func (w *FileWatch) Next() (FileEvent, error) {
	failures := 0
	for {
		if w.done {
			return FileEvent{}, io.EOF
		}
		if w.body == nil {
			err := w.open()
			if err != nil {
				var e *Error
				failures++
				if w.ctx.Err() != nil || (errors.As(err, &e) && !retryable(e)) || failures > w.c.retries {
					w.done = true
					return FileEvent{}, err
				}
				if err := sleep(w.ctx, w.c.wait(failures, err)); err != nil {
					w.done = true
					return FileEvent{}, err
				}
				continue
			}
		}
		ev, err := w.read()
		if err == nil {
			failures = 0
			if ev.Cursor != "" {
				w.cursor = ev.Cursor
			}
			return ev, nil
		}
		w.body.Close()
		w.body = nil
		var e *Error
		if errors.As(err, &e) {
			w.done = true // the server ended the watch
			return FileEvent{}, err
		}
		if w.ctx.Err() != nil {
			w.done = true
			return FileEvent{}, w.ctx.Err()
		}
		failures++
		if failures > w.c.retries {
			w.done = true
			return FileEvent{}, err
		}
		if err := sleep(w.ctx, w.c.wait(failures, err)); err != nil {
			w.done = true
			return FileEvent{}, err
		}
	}
}

// read parses the next event, skipping comments and kinds this version does not know.
func (w *FileWatch) read() (FileEvent, error) {
	var id, name string
	var data []byte
	for {
		line, err := w.rd.ReadString('\n')
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF // a watch's stream never ends cleanly
			}
			return FileEvent{}, err
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if name == "" && data == nil {
				continue
			}
			ev, known, err := decodeFileEvent(id, name, data)
			if err != nil || known {
				return ev, err
			}
			id, name, data = "", "", nil
		case strings.HasPrefix(line, ":"):
		default:
			k, v, _ := strings.Cut(line, ":")
			v = strings.TrimPrefix(v, " ")
			switch k {
			case "id":
				id = v
			case "event":
				name = v
			case "data":
				data = append(data, v...)
			}
		}
	}
}

func decodeFileEvent(id, name string, data []byte) (FileEvent, bool, error) {
	if name == "error" {
		var e struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(data, &e); err != nil {
			return FileEvent{}, true, err
		}
		return FileEvent{}, true, &Error{Status: http.StatusOK, Code: e.Code, Message: e.Message}
	}
	kind := strings.ToUpper(name)
	switch kind {
	case FileCreated, FileModified, FileDeleted, FileMoved, FileOverflow:
	default:
		return FileEvent{}, false, nil
	}
	var d struct {
		Path   string    `json:"path"`
		From   string    `json:"from"`
		IsDir  bool      `json:"is_dir"`
		At     time.Time `json:"at"`
		Missed int64     `json:"missed"`
		Reason string    `json:"reason"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return FileEvent{}, true, err
	}
	return FileEvent{Cursor: id, Kind: kind, Path: d.Path, From: d.From, IsDir: d.IsDir, At: d.At, Missed: d.Missed, Reason: d.Reason}, true, nil
}

// WatchFilesQuery is the subscription SubscribeWatchFiles runs.
const WatchFilesQuery = `subscription($sandboxId: ID!, $path: String!, $recursive: Boolean, $after: String) {
  watchFiles(sandboxId: $sandboxId, path: $path, recursive: $recursive, after: $after) {
    cursor kind path from isDir at missedEvents reason code message } }`

// SubscribeWatchFiles watches a directory over GraphQL (graphql-transport-ws), resumed after
// the last cursor when the connection drops. A watch that cannot go on is answered as the
// server's *Error (the ERROR event's code and message), then io.EOF.
func (c *Client) SubscribeWatchFiles(ctx context.Context, id, path string, opts WatchOptions) (*Typed[FileEvent], error) {
	if path == "" {
		path = "."
	}
	vars := map[string]any{"sandboxId": id, "path": path, "recursive": opts.Recursive}
	if opts.After != "" {
		vars["after"] = opts.After
	}
	s, err := c.Subscribe(ctx, WatchFilesQuery, vars)
	if err != nil {
		return nil, err
	}
	return &Typed[FileEvent]{Subscription: s, conv: decodeGraphQLFileEvent}, nil
}

func decodeGraphQLFileEvent(raw json.RawMessage) (FileEvent, error) {
	var j struct {
		Cursor       string    `json:"cursor"`
		Kind         string    `json:"kind"`
		Path         *string   `json:"path"`
		From         *string   `json:"from"`
		IsDir        bool      `json:"isDir"`
		At           time.Time `json:"at"`
		MissedEvents *int64    `json:"missedEvents"`
		Reason       *string   `json:"reason"`
		Code         *string   `json:"code"`
		Message      *string   `json:"message"`
	}
	if err := json.Unmarshal(raw, &j); err != nil {
		return FileEvent{}, err
	}
	deref := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	if j.Kind == "ERROR" {
		return FileEvent{}, &Error{Status: http.StatusOK, Code: deref(j.Code), Message: deref(j.Message)}
	}
	ev := FileEvent{Cursor: j.Cursor, Kind: j.Kind, Path: deref(j.Path), From: deref(j.From), IsDir: j.IsDir, At: j.At,
		Reason: deref(j.Reason)}
	if j.MissedEvents != nil {
		ev.Missed = *j.MissedEvents
	}
	return ev, nil
}
