package resolvers

import (
	"context"
	"encoding/json"

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

// toAgentRunEvent converts one event of a run's stream; of a chunk's data and dataBase64 only
// those in sel are built.
func toAgentRunEvent(e sandbox.AgentRunEvent, sel fieldSet) *model.AgentRunEvent {
	out := &model.AgentRunEvent{Cursor: e.Cursor, Kind: model.AgentRunEventKind(e.Kind)}
	switch e.Kind {
	case sandbox.AgentRunStatusEvent:
		out.Run = toAgentRun(*e.Run)
	case sandbox.AgentRunChunk:
		stream := model.ExecOutputStreamStdout
		if e.Stream == "stderr" {
			stream = model.ExecOutputStreamStderr
		}
		out.Stream = &stream
		out.Data, out.DataBase64 = textOf(e.Data, sel, "data"), optBase64(e.Data, sel, "dataBase64")
	case sandbox.AgentRunTruncated:
		missed := e.MissedBytes
		out.MissedBytes = &missed
	}
	return out
}

// forwardAgentRunEvents converts a run's stream; the service closes it after the final
// STATUS event.
func forwardAgentRunEvents(ctx context.Context, in <-chan sandbox.AgentRunEvent) <-chan *model.AgentRunEvent {
	sel := selectedFields(ctx, "AgentRunEvent")
	return forward(ctx, in, func(e sandbox.AgentRunEvent) *model.AgentRunEvent { return toAgentRunEvent(e, sel) }, nil)
}
