// Package client is the Go client of sandboxd: its REST API (/sandbox/sandboxes/v1 and
// /sandbox/agent/v1/runs), its GraphQL API (/graphql: queries and mutations over HTTP,
// subscriptions over graphql-transport-ws) and its Server-Sent Events streams.
//
// A Client is safe for concurrent use. New takes its base URL and API key from the options,
// else from SANDBOX_GATEWAY_URL and SANDBOX_API_KEY, the variables of the product document:
//
//	c, err := client.New()
//	sb, err := c.Create(ctx, client.CreateRequest{Profile: "sandboxes-default"})
//	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Command: []string{"bash", "-lc", "ls"}})
//
// Every error the server answers is a *Error carrying the server's stable code (NOT_FOUND,
// INVALID_STATE, QUOTA_EXCEEDED, …), its message, the HTTP status and Retry-After.
//
// Streams resume by themselves. An exec's REST output stream (ExecOutput, ExecStream) and an
// agent run's events (AgentRunEvents) reconnect after a dropped connection with the cursor of
// the last event seen; GraphQL subscriptions (Subscribe, SubscribeSandboxEvents,
// SubscribeExecOutput) redial the WebSocket with backoff and subscribe again with `after` set to
// the last cursor seen. The server replays exactly what follows that cursor, so the caller sees
// no gap and no event twice.
//
// Process control (process.go): ListExecs, SignalExec, WriteStdin and ResizeTty; an exec
// started with ExecRequest.Tty (or StdinOpen) takes input. Terminal (terminal.go) attaches to
// an exec over the terminal WebSocket: an io.ReadWriter of its output and stdin with Resize,
// which reattaches after a dropped connection from the cursor of the output it received, and
// whose Cursor lets a later Terminal go on where this one was closed.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Paths of the APIs, relative to the base URL.
const (
	SandboxesPath = "/sandbox/sandboxes/v1"
	AgentRunsPath = "/sandbox/agent/v1/runs"
	GraphQLPath   = "/graphql"
)

// Environment variables New reads when no option sets the value.
const (
	EnvGatewayURL = "SANDBOX_GATEWAY_URL"
	EnvAPIKey     = "SANDBOX_API_KEY"
)

// DefaultBaseURL is the base URL when neither WithBaseURL nor SANDBOX_GATEWAY_URL sets one: a
// local sandboxd on its default address.
const DefaultBaseURL = "http://127.0.0.1:8780"

// Client speaks to one sandboxd gateway with one API key.
type Client struct {
	base    string // no trailing slash
	key     string
	tenant  string
	project string
	http    *http.Client
	// backoff is the first wait before a stream reconnects; it doubles up to maxBackoff.
	backoff, maxBackoff time.Duration
	// retries bounds the reconnects of a stream in a row without an event in between.
	retries int
}

// Option configures a Client.
type Option func(*Client)

// WithBaseURL sets the gateway's base URL (scheme, host and an optional path prefix).
func WithBaseURL(u string) Option { return func(c *Client) { c.base = strings.TrimRight(u, "/") } }

// WithAPIKey sets the API key sent as X-Api-Key (and in a WebSocket's connection_init).
func WithAPIKey(key string) Option { return func(c *Client) { c.key = key } }

// WithHTTPClient sets the http.Client of every request, streams included. Its Timeout, if
// any, also bounds streams: leave it 0 and use contexts instead.
func WithHTTPClient(h *http.Client) Option { return func(c *Client) { c.http = h } }

// WithScope makes a platform key act for another tenant:project (X-Sandbox-Tenant-Id and
// X-Sandbox-Project-Id). Any other key that sends them gets PERMISSION_DENIED.
func WithScope(tenant, project string) Option {
	return func(c *Client) { c.tenant, c.project = tenant, project }
}

// WithReconnect sets how streams reconnect: the first wait (doubled after each failed attempt
// up to max) and how many attempts in a row may fail before the stream gives up with the
// last error. Defaults: 100 ms, 5 s, 10.
func WithReconnect(first, max time.Duration, attempts int) Option {
	return func(c *Client) { c.backoff, c.maxBackoff, c.retries = first, max, attempts }
}

// New returns a client. Without WithBaseURL it uses SANDBOX_GATEWAY_URL (else
// DefaultBaseURL); without WithAPIKey, SANDBOX_API_KEY.
func New(opts ...Option) (*Client, error) {
	c := &Client{base: strings.TrimRight(os.Getenv(EnvGatewayURL), "/"), key: os.Getenv(EnvAPIKey),
		http: http.DefaultClient, backoff: 100 * time.Millisecond, maxBackoff: 5 * time.Second, retries: 10}
	if c.base == "" {
		c.base = DefaultBaseURL
	}
	for _, o := range opts {
		o(c)
	}
	u, err := url.Parse(c.base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: base URL %q is not an http(s) URL", c.base)
	}
	if c.key == "" {
		return nil, fmt.Errorf("client: no API key (WithAPIKey or %s)", EnvAPIKey)
	}
	if (c.tenant == "") != (c.project == "") {
		return nil, errors.New("client: WithScope needs both a tenant and a project")
	}
	if c.http == nil {
		c.http = http.DefaultClient
	}
	return c, nil
}

// BaseURL is the gateway's base URL, without a trailing slash.
func (c *Client) BaseURL() string { return c.base }

// Ptr returns a pointer to v, for the optional fields of requests (AutostopSec, TimeoutSec…).
func Ptr[T any](v T) *T { return &v }

// header sets the key and scope headers.
func (c *Client) header(h http.Header) {
	h.Set("X-Api-Key", c.key)
	if c.tenant != "" {
		h.Set("X-Sandbox-Tenant-Id", c.tenant)
		h.Set("X-Sandbox-Project-Id", c.project)
	}
}

// request makes a request to path (with its query) on the base URL.
func (c *Client) request(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	c.header(req.Header)
	return req, nil
}

// send sends req and returns the response when its status is 2xx, else the server's *Error.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, restError(resp)
	}
	return resp, nil
}

// call sends a JSON request (in == nil: no body) and decodes a 2xx JSON answer into out
// (nil: discarded).
func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := c.request(ctx, method, path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("client: %s %s: decoding the answer: %w", method, path, err)
	}
	return nil
}

// sandboxPath is SandboxesPath/{id} plus the escaped further segments.
func sandboxPath(id string, rest ...string) string {
	p := SandboxesPath + "/" + url.PathEscape(id)
	for _, s := range rest {
		p += "/" + s
	}
	return p
}

// ---- errors ----

// Error is an error the server answered: REST's {"error":{"code","message",…}} or a GraphQL
// error's message and extensions.
type Error struct {
	// Status is the HTTP status (for GraphQL errors, that of the answer that carried them).
	Status int
	// Code is the server's stable code: one of the Code constants, or another the server added.
	Code string
	// Message is the server's public message.
	Message string
	// RetryAfter is when retrying may succeed (Retry-After, retry_after_sec or
	// extensions.retryAfter); 0 when the server gave none.
	RetryAfter time.Duration
	// Details are the error's further fields (REST) or extensions (GraphQL), such as "state",
	// "limit", "in_use", "field", "cost", "last_good_snapshot_id".
	Details map[string]any
	// Path is a GraphQL error's path; nil for REST.
	Path []any
	// More are the further errors of a GraphQL answer with several.
	More []*Error
}

func (e *Error) Error() string {
	s := e.Code
	if s == "" {
		s = "HTTP " + strconv.Itoa(e.Status)
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.RetryAfter > 0 {
		s += fmt.Sprintf(" (retry after %v)", e.RetryAfter)
	}
	return s
}

// Codes the server answers (README, Errors).
const (
	CodeInvalidArgument   = "INVALID_ARGUMENT"
	CodeUnauthenticated   = "UNAUTHENTICATED"
	CodePermissionDenied  = "PERMISSION_DENIED"
	CodeNotFound          = "NOT_FOUND"
	CodeInvalidState      = "INVALID_STATE"
	CodeSandboxFailed     = "SANDBOX_FAILED"
	CodeCheckpointCorrupt = "CHECKPOINT_CORRUPT"
	CodeAlreadyExists     = "ALREADY_EXISTS"
	CodePayloadTooLarge   = "PAYLOAD_TOO_LARGE"
	CodeQuotaExceeded     = "QUOTA_EXCEEDED"
	CodeRateLimited       = "RATE_LIMITED"
	CodeLimitExceeded     = "LIMIT_EXCEEDED"
	CodeCostExceeded      = "COST_EXCEEDED"
	CodeUnavailable       = "UNAVAILABLE"
	CodeInternal          = "INTERNAL"
)

// IsCode reports whether err is (or wraps) a *Error with the code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// restError reads a non-2xx REST answer.
func restError(resp *http.Response) *Error {
	e := &Error{Status: resp.StatusCode}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var body struct {
		Error map[string]any `json:"error"`
	}
	if json.Unmarshal(data, &body) != nil || body.Error == nil {
		e.Message = strings.TrimSpace(string(data))
		if len(e.Message) > 500 {
			e.Message = e.Message[:500] + "…"
		}
		return e
	}
	e.Code, _ = body.Error["code"].(string)
	e.Message, _ = body.Error["message"].(string)
	if s, ok := body.Error["retry_after_sec"].(float64); ok && e.RetryAfter == 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	for k, v := range body.Error {
		if k == "code" || k == "message" || k == "retry_after_sec" {
			continue
		}
		if e.Details == nil {
			e.Details = map[string]any{}
		}
		e.Details[k] = v
	}
	return e
}
