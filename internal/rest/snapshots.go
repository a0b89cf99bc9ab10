package rest

import (
	"net/http"
	"strconv"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/sandbox"
)

// ---- snapshots ----

type snapshotOut struct {
	SnapshotID       string    `json:"snapshot_id"`
	SandboxID        string    `json:"sandbox_id"`
	CreatedAt        time.Time `json:"created_at"`
	SizeBytes        int64     `json:"size_bytes"`
	RawSizeBytes     int64     `json:"raw_size_bytes"`
	SHA256           string    `json:"sha256"`
	ParentSnapshotID string    `json:"parent_snapshot_id,omitempty"`
}

func snapshotJSON(s sandbox.SnapshotInfo) snapshotOut {
	return snapshotOut{SnapshotID: s.ID, SandboxID: s.SandboxID, CreatedAt: s.CreatedAt, SizeBytes: s.SizeBytes,
		RawSizeBytes: s.RawSizeBytes, SHA256: s.SHA256, ParentSnapshotID: s.Parent}
}

// snapshot checkpoints a running sandbox without stopping it (201).
func (h *Handler) snapshot(w http.ResponseWriter, r *http.Request) {
	if !h.emptyBody(w, r) {
		return
	}
	snap, err := h.svc.Snapshot(r.Context(), principal(r), r.PathValue("id"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotJSON(snap))
}

// listSnapshots lists one sandbox's snapshots ({id}/snapshots) or the project's (snapshots),
// newest first, at most ?limit= of them.
func (h *Handler) listSnapshots(w http.ResponseWriter, r *http.Request) {
	limit := 0
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			h.fail(w, r, apierror.New(apierror.InvalidArgument, "limit must be a positive integer, got %q", v))
			return
		}
		limit = n
	}
	snaps, err := h.svc.ListSnapshots(r.Context(), principal(r), r.PathValue("id"), limit)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := struct {
		Snapshots []snapshotOut `json:"snapshots"`
	}{Snapshots: make([]snapshotOut, 0, len(snaps))}
	for _, s := range snaps {
		out.Snapshots = append(out.Snapshots, snapshotJSON(s))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("snapshot_id")
	if err := h.svc.DeleteSnapshot(r.Context(), principal(r), id); err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"snapshot_id": id, "deleted": true})
}
