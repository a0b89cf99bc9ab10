package rest

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"time"
	"unicode/utf8"

	"sandboxd/internal/apierror"
	"sandboxd/internal/sandbox"
)

// ---- exec ----

type execBody struct {
	Command     []string          `json:"command"`
	TimeoutSec  *int64            `json:"timeout_sec"`
	Env         map[string]string `json:"env"`
	Cwd         string            `json:"cwd"`
	Stdin       *string           `json:"stdin"`
	StdinBase64 *string           `json:"stdin_base64"`
	// Wait false answers 202 at once with the exec's status; the command runs on.
	Wait *bool `json:"wait"`
	// StdinOpen keeps stdin open for POST …/execs/{exec_id}/stdin; Tty runs the command
	// under a terminal of that size.
	StdinOpen bool     `json:"stdin_open"`
	Tty       *ttyBody `json:"tty"`
}

// ttyBody is a terminal's size: the "tty" of an exec body, and the body of a resize.
type ttyBody struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

func (b execBody) request() (sandbox.ExecRequest, error) {
	req := sandbox.ExecRequest{Command: b.Command, TimeoutSec: b.TimeoutSec, Env: b.Env, Cwd: b.Cwd,
		Detach: b.Wait != nil && !*b.Wait, StdinOpen: b.StdinOpen}
	if b.Tty != nil {
		req.Tty = &sandbox.TtySize{Rows: b.Tty.Rows, Cols: b.Tty.Cols}
	}
	switch {
	case b.Stdin != nil && b.StdinBase64 != nil:
		return req, apierror.New(apierror.InvalidArgument, "send stdin or stdin_base64, not both")
	case b.Stdin != nil:
		req.Stdin = []byte(*b.Stdin)
	case b.StdinBase64 != nil:
		data, err := base64.StdEncoding.DecodeString(*b.StdinBase64)
		if err != nil {
			return req, apierror.New(apierror.InvalidArgument, "stdin_base64 is not valid base64: %v", err)
		}
		req.Stdin = data
	}
	return req, nil
}

// exec runs a command: by default it waits and answers the result (200); with "wait": false it
// answers the status at once (202); with Accept: text/event-stream it streams the output live.
func (h *Handler) exec(w http.ResponseWriter, r *http.Request) {
	var b execBody
	if !h.decode(w, r, &b) {
		return
	}
	req, err := b.request()
	if err != nil {
		h.fail(w, r, err)
		return
	}
	id := r.PathValue("id")
	stream := acceptsEventStream(r.Header)
	req.Detach = req.Detach || stream
	res, err := h.svc.Exec(r.Context(), principal(r), id, req)
	switch {
	case err != nil:
		h.fail(w, r, err)
	case stream:
		h.streamExec(w, r, id, res)
	case req.Detach:
		out := execJSON(id, res, viewStatus)
		w.Header().Set("Location", out.StatusURL)
		writeJSON(w, http.StatusAccepted, out)
	default:
		writeJSON(w, http.StatusOK, execJSON(id, res, viewResult))
	}
}

// execStatus answers an exec's status, with its output as far as it is kept.
func (h *Handler) execStatus(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	res, err := h.svc.GetExec(r.Context(), principal(r), id, r.PathValue("exec_id"), true)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, execJSON(id, res, viewStatusOutput))
}

// execView chooses the fields of an exec's JSON.
type execView int

const (
	// viewResult is the answer of a waited exec: the fields it always had, plus sandbox_id
	// and state.
	viewResult execView = iota
	// viewStatus is the status without output: exit fields only once ENDED, plus command,
	// output_bytes, output_url and status_url.
	viewStatus
	// viewStatusOutput is viewStatus with stdout, stderr and their *_truncated.
	viewStatusOutput
)

// execOut is an exec's JSON. The first fields keep the order and form of the waited answer
// (byte for byte); pointers are fields that some views leave out.
type execOut struct {
	ExecID          string     `json:"exec_id"`
	ExitCode        *int       `json:"exit_code,omitempty"`
	Signal          string     `json:"signal,omitempty"`
	Stdout          *string    `json:"stdout,omitempty"`
	Stderr          *string    `json:"stderr,omitempty"`
	StdoutBase64    string     `json:"stdout_base64,omitempty"`
	StderrBase64    string     `json:"stderr_base64,omitempty"`
	TimedOut        *bool      `json:"timed_out,omitempty"`
	DurationMs      *int64     `json:"duration_ms,omitempty"`
	DurationSec     *float64   `json:"duration_sec,omitempty"`
	StdoutTruncated *bool      `json:"stdout_truncated,omitempty"`
	StderrTruncated *bool      `json:"stderr_truncated,omitempty"`
	StartedAt       time.Time  `json:"started_at"`
	EndedAt         *time.Time `json:"ended_at,omitempty"`
	Error           string     `json:"error,omitempty"`
	SandboxID       string     `json:"sandbox_id"`
	State           string     `json:"state"`
	Command         string     `json:"command,omitempty"`
	OutputBytes     *int64     `json:"output_bytes,omitempty"`
	OutputURL       string     `json:"output_url,omitempty"`
	StatusURL       string     `json:"status_url,omitempty"`
	// StdinOpen (statuses) says whether POST …/stdin takes bytes; Tty is the terminal's
	// size of an exec run under one.
	StdinOpen *bool    `json:"stdin_open,omitempty"`
	Tty       *ttyBody `json:"tty,omitempty"`
}

// execJSON encodes res in view v. sandboxID (the request's) stands in when res has none.
func execJSON(sandboxID string, res sandbox.ExecResult, v execView) execOut {
	if res.SandboxID != "" {
		sandboxID = res.SandboxID
	}
	out := execOut{ExecID: res.ExecID, StartedAt: res.StartedAt, SandboxID: sandboxID, State: string(res.State)}
	if v == viewResult && out.State == "" {
		out.State = string(sandbox.ExecEnded) // a waited exec has ended
	}
	if v == viewResult || res.State == sandbox.ExecEnded {
		ms, sec := res.Duration.Milliseconds(), res.Duration.Seconds()
		out.ExitCode, out.Signal, out.TimedOut, out.Error = &res.ExitCode, res.Signal, &res.TimedOut, res.Error
		out.DurationMs, out.DurationSec, out.EndedAt = &ms, &sec, &res.EndedAt
	}
	if v != viewStatus {
		stdout, stderr := string(res.Stdout), string(res.Stderr)
		out.Stdout, out.Stderr = &stdout, &stderr
		out.StdoutTruncated, out.StderrTruncated = &res.StdoutTruncated, &res.StderrTruncated
		// JSON strings are UTF-8: binary output also travels base64-encoded, byte for byte.
		if !utf8.Valid(res.Stdout) {
			out.StdoutBase64 = base64.StdEncoding.EncodeToString(res.Stdout)
		}
		if !utf8.Valid(res.Stderr) {
			out.StderrBase64 = base64.StdEncoding.EncodeToString(res.Stderr)
		}
	}
	if res.Tty != nil {
		out.Tty = &ttyBody{Rows: res.Tty.Rows, Cols: res.Tty.Cols}
	}
	if v != viewResult {
		out.StdinOpen = &res.StdinOpen
		out.Command, out.OutputBytes = res.Command, &res.OutputBytes
		out.StatusURL = Prefix + "/" + url.PathEscape(sandboxID) + "/execs/" + url.PathEscape(res.ExecID)
		out.OutputURL = out.StatusURL + "/output"
	}
	return out
}
