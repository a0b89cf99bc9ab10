package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"time"
)

// Agent run statuses.
const (
	RunQueued    = "QUEUED"
	RunRunning   = "RUNNING"
	RunSucceeded = "SUCCEEDED"
	RunFailed    = "FAILED"
	RunCancelled = "CANCELLED"
	RunTimedOut  = "TIMED_OUT"
)

// AgentRunRequest starts a catalog agent in a running sandbox.
type AgentRunRequest struct {
	AgentID     string          `json:"agent_id"`
	Model       string          `json:"model"`
	Instruction string          `json:"instruction"`
	SandboxID   string          `json:"sandbox_id"`
	PassAtK     *int            `json:"pass_at_k,omitempty"`
	Config      json.RawMessage `json:"config,omitempty"` // a JSON object; nil: {}
}

// AgentRun is an agent run.
type AgentRun struct {
	ID        string     `json:"run_id"`
	SandboxID string     `json:"sandbox_id"`
	AgentID   string     `json:"agent_id"`
	Model     string     `json:"model,omitempty"`
	Status    string     `json:"status"`
	Reason    string     `json:"reason,omitempty"`
	ExecID    string     `json:"exec_id,omitempty"`
	ExitCode  *int       `json:"exit_code,omitempty"` // once final, when the agent ran
	Signal    string     `json:"signal,omitempty"`
	RunDir    string     `json:"run_dir"`
	CreatedAt time.Time  `json:"created_at"`
	StartedAt *time.Time `json:"started_at,omitempty"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
}

// Final reports whether the run's status is final.
func (r AgentRun) Final() bool {
	switch r.Status {
	case RunSucceeded, RunFailed, RunCancelled, RunTimedOut:
		return true
	}
	return false
}

// StartAgentRun starts an agent run (POST /sandbox/agent/v1/runs).
func (c *Client) StartAgentRun(ctx context.Context, req AgentRunRequest) (AgentRun, error) {
	var r AgentRun
	err := c.call(ctx, http.MethodPost, AgentRunsPath, req, &r)
	return r, err
}

// AgentRun answers one run.
func (c *Client) AgentRun(ctx context.Context, runID string) (AgentRun, error) {
	var r AgentRun
	err := c.call(ctx, http.MethodGet, AgentRunsPath+"/"+url.PathEscape(runID), nil, &r)
	return r, err
}

// AgentRuns answers a sandbox's runs, newest first.
func (c *Client) AgentRuns(ctx context.Context, sandboxID string) ([]AgentRun, error) {
	var out struct {
		Runs []AgentRun `json:"runs"`
	}
	err := c.call(ctx, http.MethodGet, withQuery(AgentRunsPath, url.Values{"sandbox_id": {sandboxID}}), nil, &out)
	return out.Runs, err
}

// CancelAgentRun cancels a run and answers it CANCELLED.
func (c *Client) CancelAgentRun(ctx context.Context, runID string) (AgentRun, error) {
	var r AgentRun
	err := c.call(ctx, http.MethodPost, AgentRunsPath+"/"+url.PathEscape(runID)+"/cancel", nil, &r)
	return r, err
}

// AgentRunEvents follows a run's events (GET …/runs/{run_id}/events) after the cursor ("" from
// the start): a "status" event with the run first, the agent's output as "chunk" and
// "truncated" events, and a last "status" once the run is final, after which Next answers
// io.EOF. A dropped stream is resumed after the last cursor seen.
func (c *Client) AgentRunEvents(ctx context.Context, runID, after string) (*Stream, error) {
	s := &Stream{c: c, cursor: after, path: AgentRunsPath + "/" + url.PathEscape(runID) + "/events"}
	if err := s.open(ctx, nil); err != nil {
		return nil, err
	}
	return s, nil
}
