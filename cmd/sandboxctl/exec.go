package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"sandboxd/client"
)

// maxStdin bounds what exec --stdin reads: the REST body's own bound (the server's stdin bound,
// 4 MiB by default, is lower and answers PAYLOAD_TOO_LARGE).
const maxStdin = 8 << 20

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

Ctrl-C detaches: the command runs on in the sandbox, and sandboxctl prints the logs command
that follows it on from where it stopped. Flags go before SANDBOX; everything after it is the
command.`,
		Example: `  sandboxctl exec $SANDBOX_ID -- bash -lc 'python -m pytest -q'
  sandboxctl exec --timeout-sec 3600 --env CI=1 $SANDBOX_ID -- make test
  echo hello | sandboxctl exec --stdin $SANDBOX_ID -- cat
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
			if stdin {
				data, err := io.ReadAll(io.LimitReader(a.stdin, maxStdin+1))
				if err != nil {
					return err
				}
				if len(data) > maxStdin {
					return usagef("--stdin sends at most %d bytes in one request; copy larger input in with sandboxctl cp", maxStdin)
				}
				req.Stdin = data
			}
			st, err := c.ExecDetached(cmd.Context(), args[0], req)
			if err != nil {
				return err
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
			return a.follow(cmd.Context(), c, args[0], st.ExecID, "")
		}),
	}
	f := cmd.Flags()
	f.SetInterspersed(false)
	f.Int64Var(&timeout, "timeout-sec", 0, "kill the command's whole process tree after this many seconds (default: the server's, 600)")
	f.StringArrayVar(&env, "env", nil, "an environment variable, NAME=VALUE (repeatable)")
	f.StringVar(&cwd, "cwd", "", "the working folder (default /workspace)")
	f.BoolVarP(&stdin, "stdin", "i", false, "send sandboxctl's standard input to the command (read whole first, at most 8 MiB)")
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
		Args: exactArgs(1),
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
	ExecID          string     `json:"exec_id"`
	SandboxID       string     `json:"sandbox_id"`
	Command         string     `json:"command,omitempty"`
	State           string     `json:"state"`
	ExitCode        *int       `json:"exit_code,omitempty"`
	Signal          string     `json:"signal,omitempty"`
	TimedOut        bool       `json:"timed_out"`
	DurationMs      *int64     `json:"duration_ms,omitempty"`
	Error           string     `json:"error,omitempty"`
	StartedAt       *time.Time `json:"started_at,omitempty"`
	EndedAt         *time.Time `json:"ended_at,omitempty"`
	OutputBytes     int64      `json:"output_bytes"`
	Stdout          *string    `json:"stdout,omitempty"`
	Stderr          *string    `json:"stderr,omitempty"`
	StdoutBase64    string     `json:"stdout_base64,omitempty"`
	StderrBase64    string     `json:"stderr_base64,omitempty"`
	StdoutTruncated bool       `json:"stdout_truncated,omitempty"`
	StderrTruncated bool       `json:"stderr_truncated,omitempty"`
}

func execView(e client.Exec) execJSON {
	j := execJSON{ExecID: e.ExecID, SandboxID: e.SandboxID, Command: e.Command, State: e.State, Signal: e.Signal,
		TimedOut: e.TimedOut, Error: e.Error, OutputBytes: e.OutputBytes, StdoutTruncated: e.StdoutTruncated,
		StderrTruncated: e.StderrTruncated}
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
