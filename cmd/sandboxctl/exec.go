package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"sandboxd/client"
)

func (a *app) execCmd() *cobra.Command {
	var (
		timeout  int64
		env      []string
		cwd      string
		stdin    bool
		detached bool
	)
	cmd := &cobra.Command{
		Use:   "exec [flags] SANDBOX [--] COMMAND [ARG...]",
		Short: "Run a command in a sandbox, with live output and its exit code",
		Long: `Run a command in a sandbox's workspace. Its output streams live, stdout to stdout and
stderr to stderr, and sandboxctl exits with the command's exit code (128+N when signal N killed
it). The command is started detached and its output followed: a dropped connection is resumed
after the last output seen, nothing lost or repeated.

With -i, sandboxctl's standard input streams to the command as it is read (no bound on its
size: the command's stdin stays open and is closed at the end of the input); the server keeps
what the command has not read yet in a bounded buffer, and sandboxctl waits while it is full.

Ctrl-C detaches: the command runs on in the sandbox, and sandboxctl prints the logs command
that follows it on from where it stopped. Flags go before SANDBOX; everything after it is the
command.`,
		Example: `  sandboxctl exec $SANDBOX_ID -- bash -lc 'python -m pytest -q'
  sandboxctl exec --timeout-sec 3600 --env CI=1 $SANDBOX_ID -- make test
  echo hello | sandboxctl exec --stdin $SANDBOX_ID -- cat
  sandboxctl exec -i $SANDBOX_ID -- sha256sum < big.tar
  sandboxctl exec --detach $SANDBOX_ID -- bash -lc 'sleep 600'`,
		Args:              minArgs(2),
		ValidArgsFunction: a.completeSandboxes(1),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			command := args[1:]
			if command[0] == "--" {
				command = command[1:]
			}
			if len(command) == 0 {
				return usagef("exec wants a command after the sandbox")
			}
			req := client.ExecRequest{Command: command, Cwd: cwd}
			if req.Env, err = splitKV("env", env); err != nil {
				return err
			}
			if cmd.Flags().Changed("timeout-sec") {
				req.TimeoutSec = &timeout
			}
			req.StdinOpen = stdin
			st, err := c.ExecDetached(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if detached && stdin {
				// All the input first, then the exec id: the command runs on without us.
				if err := a.feedStdin(cmd.Context(), c, args[0], st.ExecID); err != nil {
					a.followHint(st.ExecID, "")
					return err
				}
			}
			if detached {
				if a.json() {
					writeJSON(a.stdout, execView(st))
				} else {
					fmt.Fprintln(a.stdout, st.ExecID)
					fmt.Fprintf(a.stderr, "follow it: sandboxctl logs %s --follow\n", st.ExecID)
				}
				return nil
			}
			if a.json() {
				v := execView(st)
				writeLine(a.stdout, streamEvent{Event: "started", Exec: &v})
			}
			if !stdin {
				return a.follow(cmd.Context(), c, args[0], st.ExecID, "")
			}
			// The input streams while the output is followed; a failure to send it ends the
			// following (the command runs on), the end of the command ends the input.
			ctx, cancel := context.WithCancelCause(cmd.Context())
			defer cancel(nil)
			go func() {
				if err := a.feedStdin(ctx, c, args[0], st.ExecID); err != nil && ctx.Err() == nil {
					cancel(err)
				}
			}()
			return a.follow(ctx, c, args[0], st.ExecID, "")
		}),
	}
	f := cmd.Flags()
	f.SetInterspersed(false)
	f.Int64Var(&timeout, "timeout-sec", 0, "kill the command's whole process tree after this many seconds (default: the server's, 600)")
	f.StringArrayVar(&env, "env", nil, "an environment variable, NAME=VALUE (repeatable)")
	f.StringVar(&cwd, "cwd", "", "the working folder (default /workspace)")
	f.BoolVarP(&stdin, "stdin", "i", false, "stream sandboxctl's standard input to the command's (closed at its end)")
	f.BoolVarP(&detached, "detach", "d", false, "start the command, print its exec id and return")
	return cmd
}

func (a *app) logsCmd() *cobra.Command {
	var (
		follow bool
		after  string
	)
	cmd := &cobra.Command{
		Use:   "logs EXEC",
		Short: "Print a command's output, or follow it from a cursor",
		Long: `Print the output a command's exec still keeps (the newest bytes of each stream, up to the
server's cap), stdout to stdout and stderr to stderr.

With --follow, replay its output from the start (or after --after CURSOR, as a detached exec
printed) and follow it live until it ends; sandboxctl then exits with the command's exit code.`,
		Example: `  sandboxctl logs exec_01J…
  sandboxctl logs exec_01J… --follow
  sandboxctl logs exec_01J… --follow --after 1757000000000-3`,
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeExecs(""),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			if after != "" && !follow {
				return usagef("--after goes with --follow")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			e, err := c.ExecByID(cmd.Context(), args[0], !follow)
			if err != nil {
				return err
			}
			if follow {
				return a.follow(cmd.Context(), c, e.SandboxID, e.ExecID, after)
			}
			if a.json() {
				writeJSON(a.stdout, execView(e))
				return nil
			}
			_, _ = io.WriteString(a.stdout, e.Stdout)
			_, _ = io.WriteString(a.stderr, e.Stderr)
			if e.StdoutTruncated || e.StderrTruncated {
				fmt.Fprintln(a.stderr, "sandboxctl: older output is no longer kept; this is its newest part")
			}
			return nil
		}),
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the output live until the command ends")
	cmd.Flags().StringVar(&after, "after", "", "with --follow: start after this cursor")
	return cmd
}

// follow prints an exec's output from after the cursor until its exit event and ends with the
// command's exit code. When ctx ends (Ctrl-C) it detaches and says how to follow on.
func (a *app) follow(ctx context.Context, c *client.Client, sandboxID, execID, after string) error {
	s, err := c.ExecOutput(ctx, sandboxID, execID, after)
	if err != nil {
		if cause := stopCause(ctx); cause != nil {
			a.followHint(execID, after)
			return cause
		}
		return err
	}
	defer s.Close()
	for {
		ev, err := s.Next()
		if err == io.EOF {
			// Nothing after the cursor of an ended exec: its status has the exit.
			st, err := c.ExecStatus(context.WithoutCancel(ctx), sandboxID, execID)
			if err != nil {
				return err
			}
			return a.exit(st)
		}
		if err != nil {
			if cause := stopCause(ctx); cause != nil {
				a.followHint(execID, s.Cursor())
				return cause
			}
			if ctx.Err() != nil {
				return a.detached(execID, s.Cursor())
			}
			a.followHint(execID, s.Cursor())
			return err
		}
		switch ev.Kind {
		case client.KindChunk:
			if a.json() {
				writeLine(a.stdout, chunkEvent(ev))
				continue
			}
			w := a.stdout
			if ev.Stream == "stderr" {
				w = a.stderr
			}
			if _, err := w.Write(ev.Data); err != nil {
				return err
			}
		case client.KindTruncated:
			if a.json() {
				writeLine(a.stdout, streamEvent{Event: "truncated", Cursor: ev.Cursor, MissedBytes: &ev.MissedBytes})
				continue
			}
			fmt.Fprintf(a.stderr, "\nsandboxctl: %d bytes of output are no longer kept; the newest output follows\n", ev.MissedBytes)
		case client.KindExit:
			if a.json() {
				v := execView(*ev.Exec)
				writeLine(a.stdout, streamEvent{Event: "exit", Cursor: ev.Cursor, Exec: &v})
			}
			return a.exit(*ev.Exec)
		}
	}
}

// stopCause is what stopped the following other than an interrupt (exec -i's input failing),
// nil otherwise.
func stopCause(ctx context.Context) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return nil
}

// detached says how to follow on after Ctrl-C and ends with exitInterrupted.
func (a *app) detached(execID, cursor string) error {
	if a.json() {
		writeLine(a.stdout, streamEvent{Event: "detached", Cursor: cursor, ExecID: execID})
	} else {
		fmt.Fprintf(a.stderr, "\nsandboxctl: detached; %s runs on in the sandbox.\n", execID)
	}
	a.followHint(execID, cursor)
	return &exitStatus{exitInterrupted}
}

func (a *app) followHint(execID, cursor string) {
	hint := "sandboxctl logs " + execID + " --follow"
	if cursor != "" {
		hint += " --after " + cursor
	}
	fmt.Fprintf(a.stderr, "follow it on: %s\n", hint)
}

// exit ends sandboxctl with an ended exec's code: its exit code, 128+N when signal N killed
// it; a command that could not run to its end is a server-side failure.
func (a *app) exit(e client.Exec) error {
	code := e.ExitCode
	switch {
	case e.Signal != "":
		code = 128 + int(unix.SignalNum(e.Signal))
		if e.TimedOut && !a.json() {
			fmt.Fprintf(a.stderr, "sandboxctl: %s timed out and was killed (%s)\n", e.ExecID, e.Signal)
		} else if !a.json() {
			fmt.Fprintf(a.stderr, "sandboxctl: %s was killed by %s\n", e.ExecID, e.Signal)
		}
	case e.Error != "" && (code < 0 || code > 255):
		if !a.json() {
			fmt.Fprintf(a.stderr, "sandboxctl: %s: %s\n", e.ExecID, e.Error)
		}
		code = exitServer
	case e.TimedOut && !a.json():
		fmt.Fprintf(a.stderr, "sandboxctl: %s timed out\n", e.ExecID)
	}
	if code < 0 || code > 255 {
		code = exitServer
	}
	if code == 0 {
		return nil
	}
	return &exitStatus{code}
}

// streamEvent is one line of a followed stream with --output json: the REST stream's event
// name and cursor, and its data.
type streamEvent struct {
	Event       string           `json:"event"` // started, chunk, truncated, exit, detached; status (agent runs)
	Cursor      string           `json:"cursor,omitempty"`
	Stream      string           `json:"stream,omitempty"`
	Data        *string          `json:"data,omitempty"`
	DataBase64  string           `json:"data_base64,omitempty"`
	MissedBytes *int64           `json:"missed_bytes,omitempty"`
	Exec        *execJSON        `json:"exec,omitempty"`
	ExecID      string           `json:"exec_id,omitempty"`
	Run         *client.AgentRun `json:"run,omitempty"`
}

// chunkEvent is an output chunk: text in data, or data_base64 when it is not UTF-8.
func chunkEvent(ev client.Event) streamEvent {
	out := streamEvent{Event: "chunk", Cursor: ev.Cursor, Stream: ev.Stream}
	if utf8.Valid(ev.Data) {
		d := string(ev.Data)
		out.Data = &d
	} else {
		out.DataBase64 = base64.StdEncoding.EncodeToString(ev.Data)
	}
	return out
}

// execJSON is an exec as sandboxctl prints it: the REST API's field names.
type execJSON struct {
	ExecID          string          `json:"exec_id"`
	SandboxID       string          `json:"sandbox_id"`
	Command         string          `json:"command,omitempty"`
	State           string          `json:"state"`
	ExitCode        *int            `json:"exit_code,omitempty"`
	Signal          string          `json:"signal,omitempty"`
	TimedOut        bool            `json:"timed_out"`
	DurationMs      *int64          `json:"duration_ms,omitempty"`
	Error           string          `json:"error,omitempty"`
	StartedAt       *time.Time      `json:"started_at,omitempty"`
	EndedAt         *time.Time      `json:"ended_at,omitempty"`
	OutputBytes     int64           `json:"output_bytes"`
	Stdout          *string         `json:"stdout,omitempty"`
	Stderr          *string         `json:"stderr,omitempty"`
	StdoutBase64    string          `json:"stdout_base64,omitempty"`
	StderrBase64    string          `json:"stderr_base64,omitempty"`
	StdoutTruncated bool            `json:"stdout_truncated,omitempty"`
	StderrTruncated bool            `json:"stderr_truncated,omitempty"`
	StdinOpen       bool            `json:"stdin_open,omitempty"`
	Tty             *client.TtySize `json:"tty,omitempty"`
}

func execView(e client.Exec) execJSON {
	j := execJSON{ExecID: e.ExecID, SandboxID: e.SandboxID, Command: e.Command, State: e.State, Signal: e.Signal,
		TimedOut: e.TimedOut, Error: e.Error, OutputBytes: e.OutputBytes, StdoutTruncated: e.StdoutTruncated,
		StderrTruncated: e.StderrTruncated, StdinOpen: e.StdinOpen, Tty: e.Tty}
	if !e.StartedAt.IsZero() {
		j.StartedAt = &e.StartedAt
	}
	if e.State == client.ExecEnded {
		code, ms := e.ExitCode, e.Duration.Milliseconds()
		j.ExitCode, j.DurationMs = &code, &ms
		if !e.EndedAt.IsZero() {
			j.EndedAt = &e.EndedAt
		}
	}
	for _, s := range []struct {
		v    string
		text **string
		b64  *string
	}{{e.Stdout, &j.Stdout, &j.StdoutBase64}, {e.Stderr, &j.Stderr, &j.StderrBase64}} {
		switch {
		case s.v == "":
		case utf8.ValidString(s.v):
			v := s.v
			*s.text = &v
		default:
			*s.b64 = base64.StdEncoding.EncodeToString([]byte(s.v))
		}
	}
	return j
}

func minArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < n {
			return usagef("%s wants at least %d arguments (%s), got %d", cmd.CommandPath(), n, cmd.Use, len(args))
		}
		return nil
	}
}
