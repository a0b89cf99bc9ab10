package client

import (
	"context"
	"encoding/base64"
	"time"
)

// execByIDQuery reads one exec by its id alone (GraphQL's exec query: the REST paths need the
// sandbox too); $output selects its output.
const execByIDQuery = `query($id: ID!, $output: Boolean!) {
  exec(id: $id) {
    execId sandboxId command state exitCode signal timedOut durationMs startedAt endedAt outputBytes error
    stdoutBase64 @include(if: $output) stderrBase64 @include(if: $output)
    stdoutTruncated @include(if: $output) stderrTruncated @include(if: $output) } }`

// ExecByID answers an exec's status from its id alone, with its sandbox (SandboxID), so that
// the REST calls that name both can follow; with output, also the newest output still kept (as
// ExecStatus). Another tenant's exec is NOT_FOUND.
func (c *Client) ExecByID(ctx context.Context, execID string, output bool) (Exec, error) {
	var data struct {
		Exec *struct {
			ExecID          string     `json:"execId"`
			SandboxID       string     `json:"sandboxId"`
			Command         string     `json:"command"`
			State           string     `json:"state"`
			ExitCode        *int       `json:"exitCode"`
			Signal          *string    `json:"signal"`
			TimedOut        bool       `json:"timedOut"`
			DurationMs      *int64     `json:"durationMs"`
			StartedAt       *time.Time `json:"startedAt"`
			EndedAt         *time.Time `json:"endedAt"`
			OutputBytes     int64      `json:"outputBytes"`
			Error           *string    `json:"error"`
			StdoutBase64    string     `json:"stdoutBase64"`
			StderrBase64    string     `json:"stderrBase64"`
			StdoutTruncated bool       `json:"stdoutTruncated"`
			StderrTruncated bool       `json:"stderrTruncated"`
		} `json:"exec"`
	}
	if _, err := c.Do(ctx, execByIDQuery, map[string]any{"id": execID, "output": output}, &data); err != nil {
		return Exec{}, err
	}
	j := data.Exec
	if j == nil {
		return Exec{}, &Error{Code: CodeNotFound, Message: "exec " + execID + " not found"}
	}
	e := Exec{ExecID: j.ExecID, SandboxID: j.SandboxID, Command: j.Command, State: j.State, TimedOut: j.TimedOut,
		OutputBytes: j.OutputBytes, StdoutTruncated: j.StdoutTruncated, StderrTruncated: j.StderrTruncated}
	if j.ExitCode != nil {
		e.ExitCode = *j.ExitCode
	}
	if j.Signal != nil {
		e.Signal = *j.Signal
	}
	if j.DurationMs != nil {
		e.Duration = time.Duration(*j.DurationMs) * time.Millisecond
	}
	if j.StartedAt != nil {
		e.StartedAt = *j.StartedAt
	}
	if j.EndedAt != nil {
		e.EndedAt = *j.EndedAt
	}
	if j.Error != nil {
		e.Error = *j.Error
	}
	for _, f := range []struct {
		b64 string
		dst *string
	}{{j.StdoutBase64, &e.Stdout}, {j.StderrBase64, &e.Stderr}} {
		raw, err := base64.StdEncoding.DecodeString(f.b64)
		if err != nil {
			return Exec{}, err
		}
		*f.dst = string(raw)
	}
	return e, nil
}
