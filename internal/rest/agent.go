package rest

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/sandbox"
)

// ---- agent runs (/sandbox/agent/v1/runs) ----

// AgentPrefix is the root of the agent run REST paths.
const AgentPrefix = "/sandbox/agent/v1"

type agentRunBody struct {
	AgentID     string          `json:"agent_id"`
	Model       string          `json:"model"`
	Instruction string          `json:"instruction"`
	SandboxID   string          `json:"sandbox_id"`
	PassAtK     *int            `json:"pass_at_k"`
	Config      json.RawMessage `json:"config"`
}

type agentRunOut struct {
	RunID     string     `json:"run_id"`
	SandboxID string     `json:"sandbox_id"`
	AgentID   string     `json:"agent_id"`
	Model     string     `json:"model,omitempty"`
	Status    string     `json:"status"`
	Reason    string     `json:"reason,omitempty"`
	ExecID    string     `json:"exec_id,omitempty"`
	ExitCode  *int       `json:"exit_code,omitempty"`
	Signal    string     `json:"signal,omitempty"`
	RunDir    string     `json:"run_dir"`
	CreatedAt time.Time  `json:"created_at"`
	StartedAt *time.Time `json:"started_at,omitempty"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
}

func agentRunJSON(r sandbox.AgentRun) agentRunOut {
	out := agentRunOut{RunID: r.ID, SandboxID: r.SandboxID, AgentID: r.AgentID, Model: r.Model, Status: string(r.Status),
		Reason: r.Reason, ExecID: r.ExecID, Signal: r.Signal, RunDir: r.RunDir, CreatedAt: r.CreatedAt}
	if r.Status.Terminal() && r.ExecID != "" {
		code := r.ExitCode
		out.ExitCode = &code
	}
	if t := r.StartedAt; !t.IsZero() {
		out.StartedAt = &t
	}
	if t := r.EndedAt; !t.IsZero() {
		out.EndedAt = &t
	}
	return out
}

// startAgentRun starts a catalog agent in a running sandbox (201 with the run).
func (h *Handler) startAgentRun(w http.ResponseWriter, r *http.Request) {
	var b agentRunBody
	if !h.decode(w, r, &b) {
		return
	}
	// "config": null is no config, as absent (and as GraphQL's null): not the text "null".
	if bytes.Equal(bytes.TrimSpace(b.Config), []byte("null")) {
		b.Config = nil
	}
	req := sandbox.AgentRunRequest{AgentID: b.AgentID, Model: b.Model, Instruction: b.Instruction, SandboxID: b.SandboxID,
		Config: b.Config}
	if b.PassAtK != nil {
		if *b.PassAtK < 1 {
			h.fail(w, r, apierror.New(apierror.InvalidArgument, "pass_at_k must be at least 1, got %d", *b.PassAtK).WithDetail("field", "pass_at_k"))
			return
		}
		req.PassAtK = *b.PassAtK
	}
	run, err := h.svc.StartAgentRun(r.Context(), principal(r), req)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, agentRunJSON(run))
}

func (h *Handler) getAgentRun(w http.ResponseWriter, r *http.Request) {
	run, err := h.svc.GetAgentRun(r.Context(), principal(r), r.PathValue("run_id"))
	h.answerRun(w, r, run, err)
}

func (h *Handler) cancelAgentRun(w http.ResponseWriter, r *http.Request) {
	if !h.emptyBody(w, r) {
		return
	}
	run, err := h.svc.CancelAgentRun(r.Context(), principal(r), r.PathValue("run_id"))
	h.answerRun(w, r, run, err)
}

func (h *Handler) answerRun(w http.ResponseWriter, r *http.Request, run sandbox.AgentRun, err error) {
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, agentRunJSON(run))
}

// listAgentRuns lists a sandbox's runs, newest first (?sandbox_id= is required).
func (h *Handler) listAgentRuns(w http.ResponseWriter, r *http.Request) {
	runs, err := h.svc.ListAgentRuns(r.Context(), principal(r), r.URL.Query().Get("sandbox_id"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := make([]agentRunOut, 0, len(runs))
	for _, run := range runs {
		out = append(out, agentRunJSON(run))
	}
	writeJSON(w, http.StatusOK, map[string]any{"runs": out})
}

// agentRunEvents streams a run as Server-Sent Events: "status" (the run) first, "chunk" and
// "truncated" for the agent's output after the cursor (?after=, else Last-Event-ID), and a
// last "status" once the run is final.
func (h *Handler) agentRunEvents(w http.ResponseWriter, r *http.Request) {
	after := r.Header.Get("Last-Event-ID")
	if q := r.URL.Query(); q.Has("after") {
		after = q.Get("after")
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ch, err := h.svc.AgentRunEvents(ctx, principal(r), r.PathValue("run_id"), after)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	s := h.startSSE(w)
	if s.flush() != nil {
		return
	}
	pump(h, ctx, s, ch, nil, func(ev sandbox.AgentRunEvent) (bool, error) {
		switch ev.Kind {
		case sandbox.AgentRunStatusEvent:
			return false, s.event(ev.Cursor, "status", agentRunJSON(*ev.Run))
		case sandbox.AgentRunChunk:
			_, err := s.execEvent("", sandbox.ExecEvent{Kind: sandbox.ExecChunk, Cursor: ev.Cursor, Stream: ev.Stream, Data: ev.Data})
			return false, err
		case sandbox.AgentRunTruncated:
			_, err := s.execEvent("", sandbox.ExecEvent{Kind: sandbox.ExecTruncated, Cursor: ev.Cursor, MissedBytes: ev.MissedBytes})
			return false, err
		}
		return false, nil
	})
}
