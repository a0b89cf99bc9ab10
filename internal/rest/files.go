package rest

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/sandbox"
)

// ---- file operations: delete, move, mkdir, stat, watch ----

// boolParam reads an optional boolean query parameter (true/false/1/0; absent is false).
func boolParam(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, apierror.New(apierror.InvalidArgument, "%s must be true or false, got %q", name, apierror.Truncate(v, 64)).
			WithDetail("field", name)
	}
	return b, nil
}

// deleteFile deletes a file, a symlink or an empty folder; a full folder only with
// ?recursive=true (else 409 DIRECTORY_NOT_EMPTY).
func (h *Handler) deleteFile(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("name") != "files" {
		h.notFound(w, r)
		return
	}
	recursive, err := boolParam(r, "recursive")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	path := r.URL.Query().Get("path")
	if err := h.svc.DeleteFile(r.Context(), principal(r), r.PathValue("id"), path, recursive); err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"path": path, "deleted": true})
}

type moveBody struct {
	From      string `json:"from"`
	To        string `json:"to"`
	Overwrite bool   `json:"overwrite"`
}

// moveFile renames {"from"} to {"to"} (the new name itself); an existing target is 409
// ALREADY_EXISTS unless "overwrite": true.
func (h *Handler) moveFile(w http.ResponseWriter, r *http.Request) {
	var b moveBody
	if !h.decode(w, r, &b) {
		return
	}
	if b.From == "" || b.To == "" {
		h.fail(w, r, apierror.New(apierror.InvalidArgument, "from and to are required"))
		return
	}
	fi, err := h.svc.MoveFile(r.Context(), principal(r), r.PathValue("id"), b.From, b.To, b.Overwrite)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fileJSON(fi))
}

// makeDir makes ?path= and its parents: 201 when it made it, 200 when it existed.
func (h *Handler) makeDir(w http.ResponseWriter, r *http.Request) {
	if !h.emptyBody(w, r) {
		return
	}
	fi, created, err := h.svc.MakeDir(r.Context(), principal(r), r.PathValue("id"), r.URL.Query().Get("path"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, struct {
		fileOut
		Created bool `json:"created"`
	}{fileJSON(fi), created})
}

// statFile describes ?path= without following a symlink at its end.
func (h *Handler) statFile(w http.ResponseWriter, r *http.Request) {
	fi, err := h.svc.StatFile(r.Context(), principal(r), r.PathValue("id"), r.URL.Query().Get("path"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fileJSON(fi))
}

// fileEventOut is the data of one watch event.
type fileEventOut struct {
	Path   string    `json:"path,omitempty"`
	From   string    `json:"from,omitempty"`
	IsDir  bool      `json:"is_dir"`
	At     time.Time `json:"at"`
	Missed *int64    `json:"missed,omitempty"`
	Reason string    `json:"reason,omitempty"`
}

// watchFiles streams changes below ?path= (the whole tree with ?recursive=true) as
// Server-Sent Events: "created", "modified", "deleted", "moved" (with "from"), "overflow"
// (events were lost: "reason", "missed"), each with its cursor as id; resume after
// ?after= (else Last-Event-ID). An "error" event with {"code","message"} ends the stream.
func (h *Handler) watchFiles(w http.ResponseWriter, r *http.Request) {
	recursive, err := boolParam(r, "recursive")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	q := r.URL.Query()
	after := r.Header.Get("Last-Event-ID")
	if q.Has("after") {
		after = q.Get("after")
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ch, err := h.svc.WatchFiles(ctx, principal(r), r.PathValue("id"),
		sandbox.WatchRequest{Path: q.Get("path"), Recursive: recursive, After: after})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	s := h.startSSE(w)
	if s.flush() != nil {
		return
	}
	pump(h, ctx, s, ch, nil, s.fileEvent)
}

// fileEvent writes one watch event; end is true for the error that ends the stream.
func (s *sse) fileEvent(ev sandbox.FileEvent) (end bool, err error) {
	out := fileEventOut{Path: ev.Path, From: ev.From, IsDir: ev.IsDir, At: ev.At}
	if ev.Kind == sandbox.FileWatchError {
		return true, s.event(ev.Cursor, "error", map[string]string{"code": string(ev.Code), "message": ev.Message})
	}
	if ev.Kind == sandbox.FileOverflow {
		missed := ev.Missed
		out.Missed, out.Reason = &missed, ev.Reason
	}
	return false, s.event(ev.Cursor, strings.ToLower(string(ev.Kind)), out)
}
