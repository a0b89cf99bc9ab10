package resolvers

import (
	"context"

	"github.com/99designs/gqlgen/graphql"

	"sandboxd/graph/model"
	"sandboxd/internal/sandbox"
)

// This file holds what the exec query and the execOutput subscription need besides the
// conversions of convert.go.

// outputFields are the ExecResult fields that need the exec's output.
var outputFields = map[string]bool{
	"stdout": true, "stderr": true, "stdoutBase64": true, "stderrBase64": true,
	"stdoutTruncated": true, "stderrTruncated": true,
}

// outputSelected reports whether the selection of the field being resolved (an ExecResult)
// asks for the exec's output, directly or through fragments (@skip and @include honoured).
func outputSelected(ctx context.Context) bool {
	for _, f := range graphql.CollectFieldsCtx(ctx, []string{"ExecResult"}) {
		if outputFields[f.Name] {
			return true
		}
	}
	return false
}

// toExecOutputEvent converts one event of an exec's output stream: stream, data and
// dataBase64 (those of the two in sel) for CHUNK, missedBytes for TRUNCATED, result for EXIT.
func toExecOutputEvent(e sandbox.ExecEvent, sel fieldSet) *model.ExecOutputEvent {
	ev := &model.ExecOutputEvent{Cursor: e.Cursor, Kind: model.ExecOutputKind(e.Kind)}
	switch e.Kind {
	case sandbox.ExecChunk:
		var stream model.ExecOutputStream
		switch e.Stream {
		case "stdout":
			stream = model.ExecOutputStreamStdout
		case "stderr":
			stream = model.ExecOutputStreamStderr
		}
		if stream != "" {
			ev.Stream = &stream
		}
		ev.Data, ev.DataBase64 = textOf(e.Data, sel, "data"), optBase64(e.Data, sel, "dataBase64")
	case sandbox.ExecTruncated:
		missed := e.MissedBytes
		ev.MissedBytes = &missed
	case sandbox.ExecExit:
		if e.Result != nil {
			ev.Result = toExecResult(*e.Result, nil) // carries no output
		}
	}
	return ev
}

// forwardExecOutput converts the service's output stream into the subscription's channel; it
// ends after EXIT even if the service's channel were to stay open.
func forwardExecOutput(ctx context.Context, in <-chan sandbox.ExecEvent) <-chan *model.ExecOutputEvent {
	sel := selectedFields(ctx, "ExecOutputEvent")
	return forward(ctx, in, func(e sandbox.ExecEvent) *model.ExecOutputEvent { return toExecOutputEvent(e, sel) },
		func(e sandbox.ExecEvent) bool { return e.Kind == sandbox.ExecExit })
}
