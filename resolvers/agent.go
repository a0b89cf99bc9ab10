package resolvers

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"unicode/utf8"

	"sandboxd/graph/model"
	"sandboxd/internal/sandbox"
)

// agentRunRequest converts startAgentRun's input.
func agentRunRequest(in model.StartAgentRunInput) (sandbox.AgentRunRequest, error) {
	req := sandbox.AgentRunRequest{AgentID: in.AgentID, Model: deref(in.Model), Instruction: in.Instruction, SandboxID: in.SandboxID}
	if in.PassAtK != nil {
		if *in.PassAtK < 1 {
			return req, invalidArg("passAtK", "passAtK must be at least 1, got %d", *in.PassAtK)
		}
		req.PassAtK = *in.PassAtK
	}
	if in.Config != nil {
		b, err := json.Marshal(in.Config)
		if err != nil {
			return req, invalidArg("config", "config must be a JSON object")
		}
		req.Config = b
	}
	return req, nil
}

func toAgentRun(r sandbox.AgentRun) *model.AgentRun {
	out := &model.AgentRun{ID: r.ID, SandboxID: r.SandboxID, AgentID: r.AgentID, Model: optString(r.Model),
		Status: model.AgentRunStatus(r.Status), Reason: optString(r.Reason), ExecID: optString(r.ExecID),
		Signal: optString(r.Signal), RunDir: r.RunDir, CreatedAt: r.CreatedAt, StartedAt: optTime(r.StartedAt),
		EndedAt: optTime(r.EndedAt)}
	if r.Status.Terminal() && r.ExecID != "" {
		code := r.ExitCode
		out.ExitCode = &code
	}
	return out
}

func toAgentRuns(rs []sandbox.AgentRun) []*model.AgentRun {
	out := make([]*model.AgentRun, 0, len(rs))
	for _, r := range rs {
		out = append(out, toAgentRun(r))
	}
	return out
}

func toAgentRunEvent(e sandbox.AgentRunEvent) *model.AgentRunEvent {
	out := &model.AgentRunEvent{Cursor: e.Cursor, Kind: model.AgentRunEventKind(e.Kind)}
	switch e.Kind {
	case sandbox.AgentRunStatusEvent:
		out.Run = toAgentRun(*e.Run)
	case sandbox.AgentRunChunk:
		stream := model.ExecOutputStreamStdout
		if e.Stream == "stderr" {
			stream = model.ExecOutputStreamStderr
		}
		b64 := base64.StdEncoding.EncodeToString(e.Data)
		out.Stream, out.DataBase64 = &stream, &b64
		if utf8.Valid(e.Data) {
			text := string(e.Data)
			out.Data = &text
		}
	case sandbox.AgentRunTruncated:
		missed := e.MissedBytes
		out.MissedBytes = &missed
	}
	return out
}

// forwardAgentRunEvents converts a run's stream; the service closes it after the final
// STATUS event.
func forwardAgentRunEvents(ctx context.Context, in <-chan sandbox.AgentRunEvent) <-chan *model.AgentRunEvent {
	return forward(ctx, in, toAgentRunEvent, nil)
}
