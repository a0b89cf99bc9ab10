package main

import (
	"context"
	"errors"
	"io"
	"time"

	"sandboxd/client"
)

// stdinChunk is the most exec -i sends in one write: what one read of its standard input
// answered, so typed lines go out as they are typed (well under client.MaxStdinWrite, and a
// quarter of the server's stdin buffer, so a full buffer drains in a few writes).
const stdinChunk = 256 << 10

// stdinRetries bounds the retries of a write the server could not take for a passing reason
// (UNAVAILABLE, RATE_LIMITED); a full stdin buffer (LIMIT_EXCEEDED: the command has not read
// yet) is retried as long as the command runs.
const stdinRetries = 5

// errStdinGone is a write to a stdin that is no longer open: the command ended or closed it.
var errStdinGone = errors.New("the command's stdin is no longer open")

// stdinError is a failure to send standard input, for the exit code and the message.
type stdinError struct{ err error }

func (e *stdinError) Error() string { return "stdin: " + e.err.Error() }
func (e *stdinError) Unwrap() error { return e.err }

// feedStdin streams sandboxctl's standard input to an exec started with StdinOpen, each read
// as one write, and closes the exec's stdin at its end. It stops quietly when the command's
// stdin is gone, and ends with ctx.
func (a *app) feedStdin(ctx context.Context, c *client.Client, sandboxID, execID string) error {
	buf := make([]byte, stdinChunk)
	for {
		n, rerr := a.stdin.Read(buf)
		if rerr != nil && rerr != io.EOF {
			return &stdinError{rerr}
		}
		eof := rerr == io.EOF
		if n > 0 || eof {
			err := a.writeStdin(ctx, c, sandboxID, execID, buf[:n], eof)
			if errors.Is(err, errStdinGone) {
				return nil
			}
			if err != nil {
				return err
			}
		}
		if eof {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// writeStdin sends one write, again while the server's stdin buffer is full (from 20 ms,
// doubling to its Retry-After) or for a few passing refusals. A write is taken whole or not
// at all, so a retry never repeats bytes; a transport error is not retried (the write may have
// been taken).
func (a *app) writeStdin(ctx context.Context, c *client.Client, sandboxID, execID string, data []byte, closeAfter bool) error {
	wait, transient := 20*time.Millisecond, 0
	for {
		_, err := c.WriteStdin(ctx, sandboxID, execID, data, closeAfter)
		var ce *client.Error
		switch {
		case err == nil:
			return nil
		case !errors.As(err, &ce):
			return err
		case ce.Code == client.CodeInvalidState:
			return errStdinGone
		case ce.Code == client.CodeLimitExceeded:
		case (ce.Code == client.CodeUnavailable || ce.Code == client.CodeRateLimited) && transient < stdinRetries:
			transient++
		default:
			return err
		}
		ceiling := ce.RetryAfter
		if ceiling <= 0 {
			ceiling = time.Second
		}
		select {
		case <-time.After(min(wait, ceiling)):
		case <-ctx.Done():
			return ctx.Err()
		}
		wait = min(2*wait, ceiling)
	}
}
