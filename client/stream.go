package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Kinds of Event.
const (
	KindStarted   = "started"   // Exec: the exec's status (ExecStream only)
	KindChunk     = "chunk"     // Stream, Data: output
	KindTruncated = "truncated" // MissedBytes: output no longer kept before this event
	KindExit      = "exit"      // Exec: the final status; always the last event of an exec
	KindStatus    = "status"    // Run: an agent run's status (AgentRunEvents only)
)

// Event is one event of a REST output stream.
type Event struct {
	Kind string
	// Cursor is the position after this event (output events only): pass it as after to
	// resume right after it.
	Cursor      string
	Stream      string // "stdout" or "stderr" (chunk)
	Data        []byte // the exact bytes (chunk)
	MissedBytes int64  // (truncated)
	Exec        *Exec  // (started, exit)
	Run         *AgentRun
}

// Stream is a REST Server-Sent Events stream of an exec's output or an agent run's events. It
// lives until its end, the end of the context it was opened with, or Close. When the
// connection drops before the end, Next reconnects (with backoff) after the last cursor seen,
// so the events it answers have no gap and no duplicate. Not safe for concurrent use.
type Stream struct {
	c                 *Client
	ctx               context.Context
	sandboxID, execID string
	path              string // the GET path that resumes the stream; "" until known
	cursor            string
	body              io.ReadCloser
	rd                *bufio.Reader
	done              bool
	// lastStatus is the last agent run status seen; a resumed stream's first status event
	// that repeats it is not answered again.
	lastStatus string
	final      bool // lastStatus is final: the stream's clean end is its end
	resumed    bool
}

// Cursor is the cursor of the last output event answered ("" before the first).
func (s *Stream) Cursor() string { return s.cursor }

// ExecID is the exec the stream follows ("" for an agent run, or before ExecStream's
// started event).
func (s *Stream) ExecID() string { return s.execID }

// Close ends the stream. It does not stop the command.
func (s *Stream) Close() error {
	s.done = true
	if s.body != nil {
		err := s.body.Close()
		s.body = nil
		return err
	}
	return nil
}

// open starts the stream: POST exec when post is set, else GET path after the cursor.
func (s *Stream) open(ctx context.Context, post map[string]any) error {
	s.ctx = ctx
	var req *http.Request
	var err error
	if post != nil {
		b, merr := json.Marshal(post)
		if merr != nil {
			return merr
		}
		req, err = s.c.request(ctx, http.MethodPost, sandboxPath(s.sandboxID, "exec"), bytes.NewReader(b))
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
		}
	} else {
		q := url.Values{}
		if s.cursor != "" {
			q.Set("after", s.cursor)
		}
		req, err = s.c.request(ctx, http.MethodGet, withQuery(s.path, q), nil)
	}
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := s.c.send(req)
	if err != nil {
		return err
	}
	if resp.StatusCode == http.StatusNoContent { // nothing after the cursor of an ended exec
		resp.Body.Close()
		s.done = true
		return nil
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		resp.Body.Close()
		return fmt.Errorf("client: %s %s answered %q, want text/event-stream", req.Method, req.URL.Path, ct)
	}
	s.body, s.rd = resp.Body, bufio.NewReaderSize(resp.Body, 64<<10)
	return nil
}

// Next answers the next event; io.EOF after the last one (an exec's exit event; the end of
// an agent run's stream after its final status). A stream error event is answered as a *Error and ends the stream, unless its code
// says that retrying may succeed (UNAVAILABLE…): then the stream is resumed like a dropped one.
func (s *Stream) Next() (Event, error) {
	failures := 0
	for {
		if s.done {
			return Event{}, io.EOF
		}
		if s.body == nil {
			if err := s.reopen(); err != nil {
				return Event{}, err
			}
			if s.done {
				return Event{}, io.EOF
			}
		}
		ev, err := s.read()
		if err != nil {
			s.body.Close()
			s.body = nil
			if err == io.EOF && s.final {
				s.done = true // an agent run's stream ends after its final status
				return Event{}, io.EOF
			}
			if s.ctx.Err() != nil {
				s.done = true
				return Event{}, s.ctx.Err()
			}
			var e *Error
			failures++
			if s.path == "" || (errors.As(err, &e) && !retryable(e)) || failures > s.c.retries {
				s.done = true
				return Event{}, err
			}
			s.resumed = true
			if err := sleep(s.ctx, s.c.wait(failures, err)); err != nil {
				s.done = true
				return Event{}, err
			}
			continue
		}
		failures = 0
		if ev.Cursor != "" {
			s.cursor = ev.Cursor
		}
		switch ev.Kind {
		case KindStarted:
			if ev.Exec != nil && s.execID == "" {
				s.execID = ev.Exec.ExecID
				s.path = sandboxPath(s.sandboxID, "execs", url.PathEscape(s.execID), "output")
			}
		case KindExit:
			s.Close()
		case KindStatus:
			if ev.Run == nil {
				continue
			}
			if s.resumed && ev.Run.Status == s.lastStatus {
				s.resumed = false
				continue // the resumed stream's first status, seen already
			}
			s.lastStatus, s.final = ev.Run.Status, ev.Run.Final()
		}
		s.resumed = false
		return ev, nil
	}
}

// reopen opens the GET path after the cursor, retrying with backoff while the server answers
// an error that retrying may cure or the connection fails.
func (s *Stream) reopen() error {
	for n := 1; ; n++ {
		err := s.open(s.ctx, nil)
		if err == nil {
			return nil
		}
		var e *Error
		if s.ctx.Err() != nil || (errors.As(err, &e) && !retryable(e)) || n > s.c.retries {
			s.done = true
			return err
		}
		if err := sleep(s.ctx, s.c.wait(n, err)); err != nil {
			s.done = true
			return err
		}
	}
}

// wait is the backoff before attempt n (n ≥ 1), at least the server's Retry-After.
func (c *Client) wait(n int, err error) time.Duration {
	d := c.backoff
	for i := 1; i < n && d < c.maxBackoff; i++ {
		d *= 2
	}
	d = min(d, c.maxBackoff)
	var e *Error
	if errors.As(err, &e) && e.RetryAfter > d {
		d = e.RetryAfter
	}
	return d
}

// retryable reports whether a stream may reconnect after the server answered e.
func retryable(e *Error) bool {
	switch e.Code {
	case CodeUnavailable, CodeRateLimited, CodeLimitExceeded, CodeInternal:
		return true
	case "":
		return e.Status >= 500 || e.Status == http.StatusTooManyRequests
	}
	return false
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// read parses the next event, skipping comments and events this version does not know.
func (s *Stream) read() (Event, error) {
	var id, name string
	var data []byte
	for {
		line, err := s.rd.ReadString('\n')
		if err != nil {
			if err == io.EOF && (line != "" || name != "" || data != nil) {
				err = io.ErrUnexpectedEOF // cut inside an event
			}
			return Event{}, err
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if name == "" && data == nil {
				continue // after a comment
			}
			ev, known, err := decodeEvent(id, name, data)
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
				if data != nil {
					data = append(data, '\n')
				}
				data = append(data, v...)
			}
		}
	}
}

func decodeEvent(id, name string, data []byte) (Event, bool, error) {
	ev := Event{Kind: name, Cursor: id}
	switch name {
	case KindChunk:
		var c struct {
			Stream     string `json:"stream"`
			Data       string `json:"data"`
			DataBase64 string `json:"data_base64"`
		}
		if err := json.Unmarshal(data, &c); err != nil {
			return ev, true, err
		}
		ev.Stream, ev.Data = c.Stream, []byte(c.Data)
		if c.DataBase64 != "" {
			raw, err := base64.StdEncoding.DecodeString(c.DataBase64)
			if err != nil {
				return ev, true, err
			}
			ev.Data = raw
		}
	case KindTruncated:
		var t struct {
			MissedBytes int64 `json:"missed_bytes"`
		}
		if err := json.Unmarshal(data, &t); err != nil {
			return ev, true, err
		}
		ev.MissedBytes = t.MissedBytes
	case KindStarted, KindExit:
		ev.Exec = new(Exec)
		if err := json.Unmarshal(data, ev.Exec); err != nil {
			return ev, true, err
		}
	case KindStatus:
		ev.Run = new(AgentRun)
		if err := json.Unmarshal(data, ev.Run); err != nil {
			return ev, true, err
		}
	case "error":
		var e struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(data, &e); err != nil {
			return ev, true, err
		}
		return ev, true, &Error{Status: http.StatusOK, Code: e.Code, Message: e.Message}
	default:
		return ev, false, nil
	}
	return ev, true, nil
}

func decodeBody(resp *http.Response, v any) error {
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("client: decoding the answer: %w", err)
	}
	return nil
}
