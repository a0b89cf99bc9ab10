package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Response is a finished HTTP exchange.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
	// Request is "METHOD path", for messages.
	Request string
}

func (r *Response) String() string {
	body := string(r.Body)
	if len(body) > 2000 {
		body = body[:2000] + fmt.Sprintf("… (%d bytes)", len(r.Body))
	}
	return fmt.Sprintf("%s → %d %s", r.Request, r.Status, strings.TrimSpace(body))
}

// Send makes one request. Headers are "Name: value" as curl -H takes them; a nil body sends
// none (curl -X POST without -d).
func (s *Server) Send(method, path string, body io.Reader, headers ...string) (*Response, error) {
	return s.SendContext(context.Background(), method, path, body, headers...)
}

// SendContext is Send with a context.
func (s *Server) SendContext(ctx context.Context, method, path string, body io.Reader, headers ...string) (*Response, error) {
	return s.SendVia(ctx, s.client, method, path, body, headers...)
}

// SendVia makes one request with HTTP client c (a client of its own, with its own connections).
// A REST exchange is checked against the server's OpenAPI document (openapi.go).
func (s *Server) SendVia(ctx context.Context, c *http.Client, method, path string, body io.Reader, headers ...string) (*Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", "curl/8.5.0")
	req.Header.Set("Accept", "*/*")
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok {
			return nil, fmt.Errorf("header %q is not \"Name: value\"", h)
		}
		req.Header.Set(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	checked := *c
	checked.Transport = s.Transport(c.Transport)
	resp, err := checked.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: data, Request: method + " " + path}, nil
}

// Curl makes one request and fails the test when it cannot be made.
func (s *Server) Curl(t *testing.T, method, path string, body []byte, headers ...string) *Response {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	r, err := s.Send(method, path, rd, headers...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Want fails the test unless the status is want.
func (r *Response) Want(t *testing.T, status int) {
	t.Helper()
	if r.Status != status {
		t.Fatalf("%s: got status %d, want %d", r, r.Status, status)
	}
}

// Decode decodes a JSON answer into v.
func (r *Response) Decode(t *testing.T, v any) {
	t.Helper()
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("%s: got Content-Type %q, want application/json", r, ct)
	}
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("%s: decoding the answer: %v", r, err)
	}
}

// APIError is the REST error body.
type APIError struct {
	Error struct {
		Code          string `json:"code"`
		Message       string `json:"message"`
		State         string `json:"state"`
		RetryAfterSec int    `json:"retry_after_sec"`
		// Limit and InUse are in a QUOTA_EXCEEDED error.
		Limit *int `json:"limit"`
		InUse *int `json:"in_use"`
	} `json:"error"`
}

// WantError reports (without stopping the test) unless the answer is an error with this status
// and code whose message mentions every one of mention (case-insensitively).
func (r *Response) WantError(t *testing.T, status int, code string, mention ...string) APIError {
	t.Helper()
	var e APIError
	if r.Status != status {
		t.Errorf("%s: got status %d, want %d %s", r, r.Status, status, code)
		return e
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("%s: got Content-Type %q, want application/json", r, ct)
		return e
	}
	if err := json.Unmarshal(r.Body, &e); err != nil {
		t.Errorf("%s: decoding the error: %v", r, err)
		return e
	}
	if e.Error.Code != code {
		t.Errorf("%s: got code %q, want %q", r, e.Error.Code, code)
	}
	if e.Error.Message == "" {
		t.Errorf("%s: got an empty error message", r)
	}
	for _, m := range mention {
		if !strings.Contains(strings.ToLower(e.Error.Message), strings.ToLower(m)) {
			t.Errorf("%s: got message %q, want it to mention %q", r, e.Error.Message, m)
		}
	}
	return e
}
