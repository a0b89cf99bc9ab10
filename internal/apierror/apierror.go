// Package apierror is the one table of error codes: every domain error that a client may see
// carries a Code, and the code decides the HTTP status (REST) and extensions.code (GraphQL).
// Only an Error's Message reaches a client; any other error is "internal error".
package apierror

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
)

// Code is a stable, documented error code.
type Code string

// The codes. Keep README.md's error table in step.
const (
	InvalidArgument  Code = "INVALID_ARGUMENT"
	Unauthenticated  Code = "UNAUTHENTICATED"
	PermissionDenied Code = "PERMISSION_DENIED"
	NotFound         Code = "NOT_FOUND"
	InvalidState     Code = "INVALID_STATE"
	AlreadyExists    Code = "ALREADY_EXISTS"
	PayloadTooLarge  Code = "PAYLOAD_TOO_LARGE"
	QuotaExceeded    Code = "QUOTA_EXCEEDED"
	// RateLimited: the API key spent its request budget (rate_limit); retry after RetryAfter.
	RateLimited Code = "RATE_LIMITED"
	// LimitExceeded: a cap on concurrent use was reached (streams per connection or per
	// tenant:project, running commands per sandbox); Details["limit_name"] names the cap.
	LimitExceeded Code = "LIMIT_EXCEEDED"
	// CostExceeded: a GraphQL operation costs more than its budget (points, bytes it may read,
	// or mutation fields); refused before anything of it ran.
	CostExceeded  Code = "COST_EXCEEDED"
	Unavailable   Code = "UNAVAILABLE"
	SandboxFailed Code = "SANDBOX_FAILED"
	// CheckpointCorrupt: a stored workspace checkpoint does not match its manifest (its hash);
	// retrying cannot help, an earlier snapshot can (the error names the last good one).
	CheckpointCorrupt Code = "CHECKPOINT_CORRUPT"
	Internal          Code = "INTERNAL"
	// DirectoryNotEmpty: a directory that is not empty was deleted without recursive (or a
	// move with overwrite named one as its target).
	DirectoryNotEmpty Code = "DIRECTORY_NOT_EMPTY"
	// CursorExpired: a stream's cursor names something that no longer exists (a file watch
	// that expired, or whose sandbox restarted): start again without the cursor, and rescan.
	CursorExpired Code = "CURSOR_EXPIRED"
	// Unsupported: the runtime cannot do this at all (pause and resume on the Kubernetes
	// runtime); retrying cannot help.
	Unsupported Code = "UNSUPPORTED"
)

// table maps each code to its HTTP status.
var table = map[Code]int{
	InvalidArgument:   http.StatusBadRequest,
	Unauthenticated:   http.StatusUnauthorized,
	PermissionDenied:  http.StatusForbidden,
	NotFound:          http.StatusNotFound,
	InvalidState:      http.StatusConflict,
	AlreadyExists:     http.StatusConflict,
	PayloadTooLarge:   http.StatusRequestEntityTooLarge,
	QuotaExceeded:     http.StatusTooManyRequests,
	RateLimited:       http.StatusTooManyRequests,
	LimitExceeded:     http.StatusTooManyRequests,
	CostExceeded:      http.StatusBadRequest,
	Unavailable:       http.StatusServiceUnavailable,
	SandboxFailed:     http.StatusConflict,
	CheckpointCorrupt: http.StatusConflict,
	Internal:          http.StatusInternalServerError,
	DirectoryNotEmpty: http.StatusConflict,
	CursorExpired:     http.StatusGone,
	Unsupported:       http.StatusNotImplemented,
}

// Codes lists every code, for documentation and tests.
func Codes() []Code {
	codes := []Code{InvalidArgument, Unauthenticated, PermissionDenied, NotFound, InvalidState,
		AlreadyExists, PayloadTooLarge, QuotaExceeded, RateLimited, LimitExceeded, CostExceeded, Unavailable, SandboxFailed, CheckpointCorrupt, Internal}
	codes = append(codes, DirectoryNotEmpty, CursorExpired, Unsupported)
	return codes
}

// HTTPStatus is the HTTP status of a code (500 for an unknown one).
func (c Code) HTTPStatus() int {
	if s, ok := table[c]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// Error is an error with a code and a message that is safe to show to the client.
type Error struct {
	Code    Code
	Message string
	// RetryAfter, when set, becomes the Retry-After header (REST) and extensions.retryAfter.
	RetryAfter time.Duration
	// Details are extra public fields (extensions in GraphQL, error fields in REST).
	Details map[string]any
	// Err is the cause, for logs only.
	Err error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

func (e *Error) Unwrap() error { return e.Err }

// New returns an Error with a formatted public message.
func New(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Wrap returns an Error with a public message and err as its (private) cause.
//
// An UNAVAILABLE that Redis's maxmemory caused says so (reason "store_full", a Retry-After).
func Wrap(err error, code Code, format string, args ...any) *Error {
	e := &Error{Code: code, Message: fmt.Sprintf(format, args...), Err: err}
	if code == Unavailable && redisFull(err) {
		e.Message += ": its state store is full (Redis reached its maxmemory); retry shortly"
		e.RetryAfter = storeFullRetryAfter
		e.WithDetail("reason", "store_full")
	}
	return e
}

// redisFull reports whether err is Redis refusing a write at its maxmemory.
func redisFull(err error) bool {
	var re redisError
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "OOM ")
}

// WithRetryAfter sets RetryAfter and returns e.
func (e *Error) WithRetryAfter(d time.Duration) *Error {
	e.RetryAfter = d
	return e
}

// WithDetail adds one public detail and returns e.
func (e *Error) WithDetail(key string, value any) *Error {
	if e.Details == nil {
		e.Details = map[string]any{}
	}
	e.Details[key] = value
	return e
}

// From returns the *Error in err's chain; else, for Redis refusing a write because it reached
// its maxmemory, an Unavailable error with reason "store_full" and a Retry-After; for a network
// error without a code (a backing service such as Redis that did not answer: restarting, or
// unreachable for a moment), an Unavailable error with a Retry-After of a second; else an
// Internal error with the generic message.
func From(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if redisFull(err) {
		return &Error{Code: Unavailable, Message: "the service's state store is full (Redis reached its maxmemory); retry shortly",
			RetryAfter: storeFullRetryAfter, Details: map[string]any{"reason": "store_full"}, Err: err}
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return &Error{Code: Unavailable, Message: "a backing service did not answer; retry shortly", RetryAfter: time.Second, Err: err}
	}
	return &Error{Code: Internal, Message: "internal error", Err: err}
}

// redisError is a command Redis refused (go-redis's redis.Error), matched by its method so that
// this package needs no Redis client.
type redisError interface {
	error
	RedisError()
}

// storeFullRetryAfter is the Retry-After of a refusal by a full Redis: its sweeps free ended
// commands' output within seconds.
const storeFullRetryAfter = 5 * time.Second

// CodeOf returns the code of err (Internal when it has none).
func CodeOf(err error) Code { return From(err).Code }

// Is reports whether err carries code.
func Is(err error, code Code) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}
