package rest

import "net/http"

// pause serves POST …/{id}/pause: the sandbox's memory and workspace kept, its compute and
// slot released (an empty body, as stop's).
func (h *Handler) pause(w http.ResponseWriter, r *http.Request) {
	if !h.emptyBody(w, r) {
		return
	}
	sb, err := h.svc.Pause(r.Context(), principal(r), r.PathValue("id"))
	h.answerSandbox(w, r, sb, err)
}

// resume serves POST …/{id}/resume: the paused sandbox back with its processes, or started on
// its workspace when they cannot come back (state_reason says so). It takes a slot.
func (h *Handler) resume(w http.ResponseWriter, r *http.Request) {
	if !h.emptyBody(w, r) {
		return
	}
	sb, err := h.svc.Resume(r.Context(), principal(r), r.PathValue("id"))
	h.answerSandbox(w, r, sb, err)
}
