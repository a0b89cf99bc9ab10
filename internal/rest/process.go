package rest

import (
	"errors"
	"io"
	"net/http"
	"strconv"

	"sandboxd/internal/apierror"
	"sandboxd/internal/execs"
	"sandboxd/internal/sandbox"
)

// ---- process control: list, signal, stdin, resize ----

// listExecs answers a page of a sandbox's execs, newest first, without output:
// ?state=RUNNING|ENDED, ?limit=N, ?cursor= the previous page's next_cursor.
func (h *Handler) listExecs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	opts := sandbox.ExecListOptions{State: sandbox.ExecState(q.Get("state")), After: q.Get("cursor")}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			h.fail(w, r, apierror.New(apierror.InvalidArgument, "limit must be a positive integer, got %q", apierror.Truncate(v, 32)))
			return
		}
		opts.Limit = n
	}
	id := r.PathValue("id")
	page, err := h.svc.ListExecs(r.Context(), principal(r), id, opts)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := struct {
		Execs      []execOut `json:"execs"`
		NextCursor string    `json:"next_cursor,omitempty"`
	}{Execs: make([]execOut, 0, len(page.Execs)), NextCursor: page.NextCursor}
	for _, e := range page.Execs {
		out.Execs = append(out.Execs, execJSON(id, e, viewStatus))
	}
	writeJSON(w, http.StatusOK, out)
}

// signalExec sends {"signal":"SIGTERM"} to a running exec's whole process tree and answers its
// status.
func (h *Handler) signalExec(w http.ResponseWriter, r *http.Request) {
	var b struct {
		Signal string `json:"signal"`
	}
	if !h.decode(w, r, &b) {
		return
	}
	id := r.PathValue("id")
	res, err := h.svc.SignalExec(r.Context(), principal(r), id, r.PathValue("exec_id"), b.Signal)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, execJSON(id, res, viewStatus))
}

// writeStdin writes the raw request body (any content type, at most execs.MaxStdinWrite bytes)
// to an exec's open stdin; ?close=true closes stdin after it.
func (h *Handler) writeStdin(w http.ResponseWriter, r *http.Request) {
	closeAfter, err := boolParam(r, "close")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if r.ContentLength > execs.MaxStdinWrite {
		h.fail(w, r, stdinTooLarge(r.ContentLength))
		return
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, execs.MaxStdinWrite))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			h.fail(w, r, stdinTooLarge(-1))
		} else {
			h.fail(w, r, apierror.New(apierror.InvalidArgument, "could not read the request body"))
		}
		return
	}
	res, err := h.svc.WriteStdin(r.Context(), principal(r), r.PathValue("id"), r.PathValue("exec_id"), data, closeAfter)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Written  int64 `json:"written"`
		Buffered int64 `json:"buffered"`
		Closed   bool  `json:"closed"`
	}{res.Written, res.Buffered, res.Closed})
}

func stdinTooLarge(n int64) error {
	if n < 0 {
		return apierror.New(apierror.PayloadTooLarge, "one stdin write carries at most %d bytes", execs.MaxStdinWrite).
			WithDetail("limit", execs.MaxStdinWrite)
	}
	return apierror.New(apierror.PayloadTooLarge, "one stdin write carries at most %d bytes, got %d", execs.MaxStdinWrite, n).
		WithDetail("limit", execs.MaxStdinWrite)
}

// resizeTty sets {"rows","cols"} of an exec's terminal and answers its status.
func (h *Handler) resizeTty(w http.ResponseWriter, r *http.Request) {
	var b ttyBody
	if !h.decode(w, r, &b) {
		return
	}
	id := r.PathValue("id")
	res, err := h.svc.ResizeTty(r.Context(), principal(r), id, r.PathValue("exec_id"), sandbox.TtySize{Rows: b.Rows, Cols: b.Cols})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, execJSON(id, res, viewStatus))
}
