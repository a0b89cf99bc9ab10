package resolvers

import (
	"context"

	"sandboxd/graph/model"
	"sandboxd/internal/sandbox"
)

// This file holds what the file operations and the watchFiles subscription need besides the
// conversions of convert.go.

// fileType converts a kind of file (nil when the sandbox did not say).
func fileType(t sandbox.FileType) *model.FileType {
	if t == "" {
		return nil
	}
	ft := model.FileType(t)
	if !ft.IsValid() {
		ft = model.FileTypeOther
	}
	return &ft
}

// toFileEvent converts one event of a file watch.
func toFileEvent(e sandbox.FileEvent) *model.FileEvent {
	ev := &model.FileEvent{Cursor: e.Cursor, Kind: model.FileEventKind(e.Kind), Path: optString(e.Path),
		From: optString(e.From), IsDir: e.IsDir, At: e.At}
	switch e.Kind {
	case sandbox.FileOverflow:
		missed := e.Missed
		ev.MissedEvents, ev.Reason = &missed, optString(e.Reason)
	case sandbox.FileWatchError:
		ev.Code, ev.Message = optString(string(e.Code)), optString(e.Message)
	}
	return ev
}

// forwardFileEvents converts the service's watch stream into the subscription's channel; it
// ends after an ERROR event.
func forwardFileEvents(ctx context.Context, in <-chan sandbox.FileEvent) <-chan *model.FileEvent {
	return forward(ctx, in, toFileEvent, func(e sandbox.FileEvent) bool { return e.Kind == sandbox.FileWatchError })
}

// watchRequest is watchFiles' arguments.
func watchRequest(path string, recursive *bool, after *string) sandbox.WatchRequest {
	return sandbox.WatchRequest{Path: path, Recursive: recursive != nil && *recursive, After: deref(after)}
}
