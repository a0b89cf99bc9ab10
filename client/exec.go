package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"time"
	"unicode/utf8"
)

// Exec states.
const (
	ExecRunning = "RUNNING"
	ExecEnded   = "ENDED"
)

// ExecRequest is a command to run in a sandbox's workspace.
type ExecRequest struct {
	Command    []string
	TimeoutSec *int64            // nil: the server's default (600)
	Env        map[string]string // added to the profile's environment
	Cwd        string            // "": /workspace
	Stdin      []byte            // sent as text when UTF-8, else base64
	// StdinOpen keeps stdin open after Stdin: write more with WriteStdin (or a Terminal),
	// which also closes it.
	StdinOpen bool
	// Tty runs the command under a terminal of this size (its output is one stream, its
	// stdin open); attach to it with Terminal.
	Tty *TtySize
}

// TtySize is a terminal's size in character cells (1 to 1000 each).
type TtySize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

func (r ExecRequest) body(wait bool) map[string]any {
	b := map[string]any{"command": r.Command}
	if r.TimeoutSec != nil {
		b["timeout_sec"] = *r.TimeoutSec
	}
	if len(r.Env) > 0 {
		b["env"] = r.Env
	}
	if r.Cwd != "" {
		b["cwd"] = r.Cwd
	}
	if r.Stdin != nil {
		if utf8.Valid(r.Stdin) {
			b["stdin"] = string(r.Stdin)
		} else {
			b["stdin_base64"] = base64.StdEncoding.EncodeToString(r.Stdin)
		}
	}
	if !wait {
		b["wait"] = false
	}
	if r.StdinOpen {
		b["stdin_open"] = true
	}
	if r.Tty != nil {
		b["tty"] = *r.Tty
	}
	return b
}

// Exec is an exec's result or status. Stdout and Stderr hold the exact bytes (the server's
// *_base64 fields decoded when the output is not UTF-8). The exit fields are set once State is
// ENDED; a waited Exec always has them.
type Exec struct {
	ExecID          string
	SandboxID       string
	State           string
	Command         string
	ExitCode        int
	Signal          string
	TimedOut        bool
	Duration        time.Duration
	Error           string
	Stdout, Stderr  string
	StdoutTruncated bool
	StderrTruncated bool
	OutputBytes     int64
	StartedAt       time.Time
	EndedAt         time.Time
	// OutputURL and StatusURL are the exec's paths (statuses only).
	OutputURL, StatusURL string
	// StdinOpen says whether WriteStdin takes bytes (statuses only); Tty is the terminal's
	// size of an exec run under one.
	StdinOpen bool
	Tty       *TtySize
}

type execJSON struct {
	ExecID          string     `json:"exec_id"`
	ExitCode        *int       `json:"exit_code"`
	Signal          string     `json:"signal"`
	Stdout          string     `json:"stdout"`
	Stderr          string     `json:"stderr"`
	StdoutBase64    string     `json:"stdout_base64"`
	StderrBase64    string     `json:"stderr_base64"`
	TimedOut        bool       `json:"timed_out"`
	DurationMs      int64      `json:"duration_ms"`
	StdoutTruncated bool       `json:"stdout_truncated"`
	StderrTruncated bool       `json:"stderr_truncated"`
	StartedAt       time.Time  `json:"started_at"`
	EndedAt         *time.Time `json:"ended_at"`
	Error           string     `json:"error"`
	SandboxID       string     `json:"sandbox_id"`
	State           string     `json:"state"`
	Command         string     `json:"command"`
	OutputBytes     int64      `json:"output_bytes"`
	OutputURL       string     `json:"output_url"`
	StatusURL       string     `json:"status_url"`
	StdinOpen       bool       `json:"stdin_open"`
	Tty             *TtySize   `json:"tty"`
}

// UnmarshalJSON reads the REST exec JSON.
func (e *Exec) UnmarshalJSON(b []byte) error {
	var j execJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*e = Exec{ExecID: j.ExecID, SandboxID: j.SandboxID, State: j.State, Command: j.Command, Signal: j.Signal,
		TimedOut: j.TimedOut, Duration: time.Duration(j.DurationMs) * time.Millisecond, Error: j.Error,
		Stdout: j.Stdout, Stderr: j.Stderr, StdoutTruncated: j.StdoutTruncated, StderrTruncated: j.StderrTruncated,
		OutputBytes: j.OutputBytes, StartedAt: j.StartedAt, OutputURL: j.OutputURL, StatusURL: j.StatusURL,
		StdinOpen: j.StdinOpen, Tty: j.Tty}
	if j.ExitCode != nil {
		e.ExitCode = *j.ExitCode
	}
	if j.EndedAt != nil {
		e.EndedAt = *j.EndedAt
	}
	for _, f := range []struct {
		b64 string
		dst *string
	}{{j.StdoutBase64, &e.Stdout}, {j.StderrBase64, &e.Stderr}} {
		if f.b64 != "" {
			raw, err := base64.StdEncoding.DecodeString(f.b64)
			if err != nil {
				return err
			}
			*f.dst = string(raw)
		}
	}
	return nil
}

// Exec runs a command and waits for its result (POST …/{id}/exec).
func (c *Client) Exec(ctx context.Context, sandboxID string, req ExecRequest) (Exec, error) {
	var e Exec
	err := c.call(ctx, http.MethodPost, sandboxPath(sandboxID, "exec"), req.body(true), &e)
	return e, err
}

// ExecDetached starts a command without waiting ("wait": false) and answers its status
// (RUNNING, with its ExecID); the command runs on after the client has gone.
func (c *Client) ExecDetached(ctx context.Context, sandboxID string, req ExecRequest) (Exec, error) {
	var e Exec
	err := c.call(ctx, http.MethodPost, sandboxPath(sandboxID, "exec"), req.body(false), &e)
	return e, err
}

// ExecStatus answers an exec's status, with its newest output as far as kept.
func (c *Client) ExecStatus(ctx context.Context, sandboxID, execID string) (Exec, error) {
	var e Exec
	err := c.call(ctx, http.MethodGet, sandboxPath(sandboxID, "execs", url.PathEscape(execID)), nil, &e)
	return e, err
}

// ExecStream runs a command and streams its output as it is written (POST …/exec with Accept:
// text/event-stream): a "started" event with the exec's status, then "chunk" and "truncated"
// events, and "exit" last. A dropped stream is resumed after the last cursor seen.
func (c *Client) ExecStream(ctx context.Context, sandboxID string, req ExecRequest) (*Stream, error) {
	s := &Stream{c: c, sandboxID: sandboxID}
	if err := s.open(ctx, req.body(true)); err != nil {
		return nil, err
	}
	return s, nil
}

// ExecOutput follows an exec's output (GET …/execs/{exec_id}/output) after the cursor ("" from
// the start) until its "exit" event. A dropped stream is resumed after the last cursor seen.
// An exec that already ended with nothing after the cursor answers a stream whose Next is
// io.EOF at once.
func (c *Client) ExecOutput(ctx context.Context, sandboxID, execID, after string) (*Stream, error) {
	s := &Stream{c: c, sandboxID: sandboxID, execID: execID, cursor: after}
	s.path = sandboxPath(sandboxID, "execs", url.PathEscape(execID), "output")
	if err := s.open(ctx, nil); err != nil {
		return nil, err
	}
	return s, nil
}
