package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
)

// Signals SignalExec sends; each reaches the exec's whole process tree.
const (
	SIGTERM = "SIGTERM"
	SIGKILL = "SIGKILL"
	SIGINT  = "SIGINT"
	SIGHUP  = "SIGHUP"
	SIGQUIT = "SIGQUIT"
	SIGUSR1 = "SIGUSR1"
	SIGUSR2 = "SIGUSR2"
)

// MaxStdinWrite is the most bytes one WriteStdin carries (larger writes are PAYLOAD_TOO_LARGE;
// a Terminal splits its writes to fit).
const MaxStdinWrite = 1 << 20

// ListExecsOptions select a page of a sandbox's execs, newest first.
type ListExecsOptions struct {
	// State is ExecRunning or ExecEnded; "" lists both.
	State string
	// Limit is the page size (0: the server's default of 50).
	Limit int
	// Cursor is the NextCursor of the previous page ("" for the first).
	Cursor string
}

// ExecPage is one page of a sandbox's execs (statuses without output).
type ExecPage struct {
	Execs []Exec
	// NextCursor is the Cursor of the next page; "" on the last page.
	NextCursor string
}

// ListExecs lists a sandbox's execs, newest first (GET …/{id}/execs): every running one, and
// ended ones as long as the server keeps their output, whatever the sandbox's state.
func (c *Client) ListExecs(ctx context.Context, sandboxID string, opts ListExecsOptions) (ExecPage, error) {
	q := url.Values{}
	if opts.State != "" {
		q.Set("state", opts.State)
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	if opts.Cursor != "" {
		q.Set("cursor", opts.Cursor)
	}
	path := sandboxPath(sandboxID, "execs")
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out struct {
		Execs      []Exec `json:"execs"`
		NextCursor string `json:"next_cursor"`
	}
	if err := c.call(ctx, http.MethodGet, path, nil, &out); err != nil {
		return ExecPage{}, err
	}
	return ExecPage{Execs: out.Execs, NextCursor: out.NextCursor}, nil
}

// SignalExec sends a signal (SIGTERM, SIGKILL, SIGINT, …) to a running exec and every process
// it started, and answers its status then (POST …/execs/{exec_id}/signal). An exec that ended
// is INVALID_STATE.
func (c *Client) SignalExec(ctx context.Context, sandboxID, execID, signal string) (Exec, error) {
	var e Exec
	err := c.call(ctx, http.MethodPost, sandboxPath(sandboxID, "execs", url.PathEscape(execID), "signal"),
		map[string]string{"signal": signal}, &e)
	return e, err
}

// StdinResult is what WriteStdin did.
type StdinResult struct {
	// Written is the bytes taken: all of them (a write is taken whole or refused).
	Written int64 `json:"written"`
	// Buffered is the bytes the command has not read yet, this write's included.
	Buffered int64 `json:"buffered"`
	// Closed says that stdin is closed now.
	Closed bool `json:"closed"`
}

// WriteStdin writes data (at most MaxStdinWrite bytes) to the stdin of an exec started with
// StdinOpen or a Tty, and closes stdin after it when closeAfter is set (POST
// …/execs/{exec_id}/stdin). A full stdin buffer (the command does not read) is LIMIT_EXCEEDED
// with RetryAfter; stdin that is not open is INVALID_STATE.
func (c *Client) WriteStdin(ctx context.Context, sandboxID, execID string, data []byte, closeAfter bool) (StdinResult, error) {
	path := sandboxPath(sandboxID, "execs", url.PathEscape(execID), "stdin")
	if closeAfter {
		path += "?close=true"
	}
	req, err := c.request(ctx, http.MethodPost, path, bytes.NewReader(data))
	if err != nil {
		return StdinResult{}, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Accept", "application/json")
	resp, err := c.send(req)
	if err != nil {
		return StdinResult{}, err
	}
	defer resp.Body.Close()
	var out StdinResult
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&out); err != nil {
		return StdinResult{}, fmt.Errorf("client: POST %s: decoding the answer: %w", path, err)
	}
	return out, nil
}

// ResizeTty sets the terminal size of an exec run under one (POST …/execs/{exec_id}/resize)
// and answers its status.
func (c *Client) ResizeTty(ctx context.Context, sandboxID, execID string, rows, cols int) (Exec, error) {
	var e Exec
	err := c.call(ctx, http.MethodPost, sandboxPath(sandboxID, "execs", url.PathEscape(execID), "resize"),
		TtySize{Rows: rows, Cols: cols}, &e)
	return e, err
}
