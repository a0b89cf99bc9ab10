package rest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"sandboxd/internal/apierror"
	"sandboxd/internal/sandbox"
)

const (
	// sseWriteTimeout bounds each write of a stream: a client that stops reading ends it.
	sseWriteTimeout = 30 * time.Second
	// sseKeepAlive is the idle time after which a stream sends a comment line.
	sseKeepAlive = 15 * time.Second
	// sseMaxBurst bounds the ready events written between two flushes.
	sseMaxBurst = 64
)

// streamExec streams a detached exec as Server-Sent Events: "started" with its status, then
// its output from the start, until the exit event.
func (h *Handler) streamExec(w http.ResponseWriter, r *http.Request, sandboxID string, res sandbox.ExecResult) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	s := h.startSSE(w)
	if s.event("", "started", execJSON(sandboxID, res, viewStatus)) != nil || s.flush() != nil {
		return
	}
	ch, err := h.svc.ExecOutput(ctx, principal(r), res.ExecID, "")
	if err != nil {
		h.streamError(s, r, err)
		return
	}
	pump(h, ctx, s, ch, nil, func(ev sandbox.ExecEvent) (bool, error) { return s.execEvent(sandboxID, ev) })
}

// execOutput reattaches to an exec's output after the cursor `after` (else Last-Event-ID, else
// from the start) and streams it as Server-Sent Events until the exit event.
func (h *Handler) execOutput(w http.ResponseWriter, r *http.Request) {
	id, execID := r.PathValue("id"), r.PathValue("exec_id")
	after := r.Header.Get("Last-Event-ID")
	if q := r.URL.Query(); q.Has("after") {
		after = q.Get("after")
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	st, ch, err := h.svc.ExecOutputStatus(ctx, principal(r), id, execID, after)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var first *sandbox.ExecEvent
	if st.State == sandbox.ExecEnded {
		// A finished exec's rest is replayed at once. Nothing after the cursor (a client that
		// reconnects after the exit event) answers 204, which stops an EventSource.
		wait := time.NewTimer(h.keepAlive)
		defer wait.Stop()
		select {
		case ev, ok := <-ch:
			if !ok {
				w.WriteHeader(http.StatusNoContent)
				return
			}
			first = &ev
		case <-wait.C:
		case <-ctx.Done():
			return
		}
	}
	s := h.startSSE(w)
	if first == nil && s.flush() != nil {
		return
	}
	pump(h, ctx, s, ch, first, func(ev sandbox.ExecEvent) (bool, error) { return s.execEvent(id, ev) })
}

// pump writes ch's events (first, when not nil, was already taken from it) with write until
// write says the stream ended, ch closes, a write fails, ctx ends or the server shuts down.
// Events that are ready together are written in one burst and flushed once; an idle stream
// gets a keepalive comment. Every REST event stream (exec output, agent runs, file watches)
// is served by it.
func pump[T any](h *Handler, ctx context.Context, s *sse, ch <-chan T, first *T, write func(T) (end bool, err error)) {
	idle := time.NewTimer(h.keepAlive)
	defer idle.Stop()
	for {
		if first == nil {
			select {
			case ev, ok := <-ch:
				if !ok {
					return
				}
				first = &ev
			case <-idle.C:
				if err := s.comment("keepalive"); err != nil || s.flush() != nil {
					return
				}
				idle.Reset(h.keepAlive)
				continue
			case <-ctx.Done():
				return
			case <-h.shutdown:
				return
			}
		}
		end, err := write(*first)
		first = nil
	burst:
		for n := 1; n < sseMaxBurst && err == nil && !end; n++ {
			select {
			case ev, ok := <-ch:
				if !ok {
					end = true // nothing more comes: flush and end
					break burst
				}
				end, err = write(ev)
			default:
				break burst
			}
		}
		if err == nil {
			err = s.flush()
		}
		if err != nil {
			h.log.Debug("event stream ended early", "err", err)
			return
		}
		if end {
			return
		}
		idle.Reset(h.keepAlive)
	}
}

// streamError ends a started stream with an "error" event carrying {"code","message"}.
func (h *Handler) streamError(s *sse, r *http.Request, err error) {
	e := apierror.From(err)
	if e.Code == apierror.Internal || e.Code == apierror.Unavailable {
		h.log.Error("stream failed", "method", r.Method, "path", r.URL.Path, "code", e.Code, "err", err)
	}
	if s.event("", "error", map[string]string{"code": string(e.Code), "message": e.Message}) == nil {
		_ = s.flush()
	}
}

// sse writes one Server-Sent Events stream, each write under a deadline so that a client
// that stops reading ends its stream instead of holding the handler.
type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	buf     bytes.Buffer
}

func (h *Handler) startSSE(w http.ResponseWriter) *sse {
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-cache")
	hd.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return &sse{w: w, rc: http.NewResponseController(w), timeout: h.writeTimeout}
}

type chunkOut struct {
	Stream     string `json:"stream"`
	Data       string `json:"data,omitempty"`
	DataBase64 string `json:"data_base64,omitempty"`
}

// execEvent writes one output event; exited is true for the exit event.
func (s *sse) execEvent(sandboxID string, ev sandbox.ExecEvent) (exited bool, err error) {
	switch ev.Kind {
	case sandbox.ExecChunk:
		// Text travels as text; binary output (not UTF-8, or holding NUL bytes, which JSON
		// would escape to six bytes each) as base64.
		if utf8.Valid(ev.Data) && bytes.IndexByte(ev.Data, 0) < 0 {
			return false, s.event(ev.Cursor, "chunk", chunkOut{Stream: ev.Stream, Data: string(ev.Data)})
		}
		return false, s.base64Chunk(ev.Cursor, ev.Stream, ev.Data)
	case sandbox.ExecTruncated:
		return false, s.event(ev.Cursor, "truncated", map[string]int64{"missed_bytes": ev.MissedBytes})
	case sandbox.ExecExit:
		var res sandbox.ExecResult
		if ev.Result != nil {
			res = *ev.Result
		}
		res.State = sandbox.ExecEnded // the exit event is the end, whatever Result says
		return true, s.event(ev.Cursor, "exit", execJSON(sandboxID, res, viewStatus))
	}
	return false, nil // a kind this version does not know: skipped
}

// event writes "id: …\nevent: …\ndata: <one-line JSON>\n\n" (no id line when id is "").
func (s *sse) event(id, name string, v any) error {
	s.buf.Reset()
	if id != "" {
		s.buf.WriteString("id: " + id + "\n")
	}
	s.buf.WriteString("event: " + name + "\ndata: ")
	enc := json.NewEncoder(&s.buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil { // one line: JSON escapes every newline
		return err
	}
	s.buf.WriteString("\n")
	return s.write()
}

// base64Chunk writes a chunk event of binary output, as event would write
// chunkOut{Stream: stream, DataBase64: <data in base64>}, encoding straight into the buffer:
// base64 needs no JSON escaping, so the output (a third more than the command wrote) is
// neither copied into a string nor scanned again.
func (s *sse) base64Chunk(id, stream string, data []byte) error {
	if len(data) == 0 || (stream != "stdout" && stream != "stderr") {
		return s.event(id, "chunk", chunkOut{Stream: stream, DataBase64: base64.StdEncoding.EncodeToString(data)})
	}
	s.buf.Reset()
	if id != "" {
		s.buf.WriteString("id: " + id + "\n")
	}
	s.buf.WriteString(`event: chunk` + "\n" + `data: {"stream":"` + stream + `","data_base64":"`)
	s.buf.Grow(base64.StdEncoding.EncodedLen(len(data)) + 4)
	s.buf.Write(base64.StdEncoding.AppendEncode(s.buf.AvailableBuffer(), data))
	s.buf.WriteString(`"}` + "\n\n")
	return s.write()
}

func (s *sse) comment(text string) error {
	s.buf.Reset()
	s.buf.WriteString(": " + text + "\n\n")
	return s.write()
}

func (s *sse) write() error {
	if err := s.deadline(); err != nil {
		return err
	}
	_, err := s.w.Write(s.buf.Bytes())
	return err
}

func (s *sse) flush() error {
	if err := s.deadline(); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *sse) deadline() error {
	err := s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	if errors.Is(err, http.ErrNotSupported) {
		return nil
	}
	return err
}

// acceptsEventStream reports whether the Accept header lists text/event-stream (in any case,
// among other types, with parameters), unless with q=0.
func acceptsEventStream(h http.Header) bool {
	for _, v := range h.Values("Accept") {
		for _, part := range strings.Split(v, ",") {
			mt, params, _ := strings.Cut(part, ";")
			if !strings.EqualFold(strings.TrimSpace(mt), "text/event-stream") {
				continue
			}
			refused := false
			for _, p := range strings.Split(params, ";") {
				k, val, _ := strings.Cut(p, "=")
				if strings.EqualFold(strings.TrimSpace(k), "q") {
					q, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
					refused = err == nil && q == 0
				}
			}
			if !refused {
				return true
			}
		}
	}
	return false
}
