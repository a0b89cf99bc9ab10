package resolvers

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql/handler/transport"
)

// Backpressure of the streaming transports. gqlgen writes a WebSocket message or an SSE event
// without a deadline, so a subscriber that stops reading (its TCP window full) would hold the
// writing goroutine, the subscription and the service's stream behind it forever, and with
// them every other write to that connection (keepalives, close on shutdown). Here each write
// gets HandlerOptions.WriteTimeout: a write that misses it closes the WebSocket, or ends the
// SSE response; the subscriptions on it end with their request's context.

// errStreamEnded is what writes to an SSE response answer once it is over.
var errStreamEnded = errors.New("graphql: the event stream has ended")

// deadlineWebsocket accepts WebSockets whose writes are bounded by timeout.
type deadlineWebsocket struct {
	impl    transport.WebsocketImplementation
	timeout time.Duration
	log     *slog.Logger
}

func (d deadlineWebsocket) Accept(w http.ResponseWriter, r *http.Request, opts transport.WebsocketAcceptOptions) (transport.WebsocketConn, error) {
	c, err := d.impl.Accept(w, r, opts)
	if err != nil {
		return nil, err
	}
	return &deadlineConn{WebsocketConn: c, ctx: r.Context(), timeout: d.timeout, log: d.log}, nil
}

// deadlineConn closes the connection when one write takes longer than timeout: closing
// unblocks the write (it fails), gqlgen's read loop then fails too and the handler returns,
// which ends the request's context and with it every subscription of the connection.
type deadlineConn struct {
	transport.WebsocketConn
	ctx     context.Context // the upgrade request's, for logs only
	timeout time.Duration
	log     *slog.Logger
}

func (c *deadlineConn) WriteJSON(v any) error {
	watchdog := time.AfterFunc(c.timeout, func() {
		c.log.InfoContext(c.ctx, "graphql: websocket write timed out; closing the connection", "timeout", c.timeout)
		_ = c.WebsocketConn.Close()
	})
	defer watchdog.Stop()
	return c.WebsocketConn.WriteJSON(v)
}

// SetReadLimit and SetReadDeadline keep the wrapped connection's optional interfaces (gqlgen
// looks for them by type assertion).
func (c *deadlineConn) SetReadLimit(limit int64) {
	if l, ok := c.WebsocketConn.(transport.WebsocketReadLimiter); ok {
		l.SetReadLimit(limit)
	}
}

func (c *deadlineConn) SetReadDeadline(t time.Time) error {
	if d, ok := c.WebsocketConn.(transport.WebsocketReadDeadliner); ok {
		return d.SetReadDeadline(t)
	}
	return nil
}

// sseWriter bounds each write and flush of an SSE response by timeout (a write deadline on the
// connection, set afresh for each). The first failed write or flush, a missed deadline or a
// client gone, ends the stream: cancel ends the request's context, and later writes fail at
// once. After finish every write fails without touching the connection (gqlgen's keepalive
// goroutine may tick once more after the handler returned).
type sseWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	cancel  context.CancelFunc
	ctx     context.Context // for logs only
	log     *slog.Logger

	mu  sync.Mutex
	err error // the first error; then every write fails
}

func newSSEWriter(ctx context.Context, w http.ResponseWriter, timeout time.Duration, cancel context.CancelFunc, log *slog.Logger) *sseWriter {
	return &sseWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: timeout, cancel: cancel, ctx: ctx, log: log}
}

func (w *sseWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return 0, w.err
	}
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	n, err := w.ResponseWriter.Write(p)
	w.failed(err)
	return n, err
}

// Flush is what gqlgen's SSE transport calls (it needs an http.Flusher).
func (w *sseWriter) Flush() { _ = w.FlushError() }

// FlushError flushes within the deadline (http.ResponseController finds it).
func (w *sseWriter) FlushError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	err := w.rc.Flush()
	w.failed(err)
	return err
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *sseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// failed records the first error and ends the stream. Called with mu held.
func (w *sseWriter) failed(err error) {
	if err == nil || w.err != nil {
		return
	}
	w.err = err
	if errors.Is(err, os.ErrDeadlineExceeded) {
		w.log.InfoContext(w.ctx, "graphql: SSE write timed out; ending the stream", "timeout", w.timeout)
	}
	w.cancel()
}

// finish is called when the handler returns: net/http's last write of the response (the end
// of the chunked body) gets one more deadline, and nothing else is written.
func (w *sseWriter) finish() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
		w.err = errStreamEnded
	}
}
