package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"sandboxd/client"
)

// detachKey is the key that detaches from a terminal: Ctrl-] (as telnet's escape), a key no
// shell or editor binds to anything it needs.
const (
	detachKey     = 0x1d
	detachKeyName = "Ctrl-]"
)

// terminalTimeoutSec is a terminal's timeout unless --timeout-sec says otherwise: a day, the
// server's default bound (a server with a lower bound gets its own default instead).
const terminalTimeoutSec = 24 * 3600

// loginShell runs the sandbox user's login shell from the passwd database, else bash, else sh.
const loginShell = `shell=$(getent passwd "$(id -u)" 2>/dev/null | cut -d: -f7)
case "$shell" in ""|*/nologin|*/false) shell=$(command -v bash || echo /bin/sh) ;; esac
exec "$shell" -l`

func (a *app) terminalCmd() *cobra.Command {
	var (
		attach, after, cwd string
		env                []string
		timeout            int64
	)
	cmd := &cobra.Command{
		Use:   "terminal SANDBOX [-- COMMAND [ARG...]] | terminal --attach EXEC [--after CURSOR]",
		Short: "Run a shell (or a command) under a terminal in a sandbox, or reattach to one",
		Long: `Run an interactive shell in a sandbox under a pseudo-terminal of your terminal's size: the
user's login shell (else bash, else sh), or COMMAND. Your terminal is in raw mode meanwhile:
every key, Ctrl-C included, goes to the sandbox, and what the sandbox prints reaches your
terminal as it is. A resize of your window resizes the sandbox's terminal.

` + detachKeyName + ` detaches: the shell runs on in the sandbox, and sandboxctl prints how to reattach.
--attach EXEC reattaches to a terminal (any exec with an open stdin), replaying the output the
server still keeps, or only what follows --after CURSOR. sandboxctl exits with the shell's exit
code when it ends, 130 when it detached.`,
		Example: `  sandboxctl terminal $SANDBOX_ID
  sandboxctl terminal $SANDBOX_ID -- python3
  sandboxctl terminal --attach exec_01J…
  sandboxctl terminal --attach exec_01J… --after 1757000000000-3`,
		ValidArgsFunction: a.completeSandboxes(1),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			switch {
			case attach != "" && len(args) > 0:
				return usagef("terminal --attach takes no sandbox or command, got %q", args)
			case attach == "" && after != "":
				return usagef("--after goes with --attach")
			case attach == "" && len(args) == 0:
				return usagef("terminal wants a sandbox (or --attach EXEC)")
			case attach != "" && (len(env) > 0 || cwd != "" || cmd.Flags().Changed("timeout-sec")):
				return usagef("--env, --cwd and --timeout-sec go with a new terminal, not --attach")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			tt := a.tty()
			if attach != "" {
				e, err := c.ExecByID(ctx, attach, false)
				if err != nil {
					return err
				}
				return a.runTerminal(ctx, c, tt, e.SandboxID, e.ExecID, after, true)
			}
			command := args[1:]
			if len(command) > 0 && command[0] == "--" {
				command = command[1:]
			}
			if len(command) == 0 {
				command = []string{"/bin/sh", "-c", loginShell}
			}
			req := client.ExecRequest{Command: command, Cwd: cwd, Tty: &client.TtySize{Rows: tt.rows, Cols: tt.cols}}
			if req.Env, err = splitKV("env", env); err != nil {
				return err
			}
			if _, set := req.Env["TERM"]; !set {
				if req.Env == nil {
					req.Env = map[string]string{}
				}
				req.Env["TERM"] = a.getenv("TERM")
				if req.Env["TERM"] == "" {
					req.Env["TERM"] = "xterm-256color"
				}
			}
			userTimeout := cmd.Flags().Changed("timeout-sec")
			if !userTimeout {
				timeout = terminalTimeoutSec
			}
			req.TimeoutSec = &timeout
			st, err := c.ExecDetached(ctx, args[0], req)
			var ce *client.Error
			if !userTimeout && errors.As(err, &ce) && ce.Code == client.CodeInvalidArgument && ce.Details["field"] == "timeout_sec" {
				req.TimeoutSec = nil // this server bounds timeouts lower: its default
				st, err = c.ExecDetached(ctx, args[0], req)
			}
			if err != nil {
				return err
			}
			return a.runTerminal(ctx, c, tt, args[0], st.ExecID, "", false)
		}),
	}
	f := cmd.Flags()
	f.SetInterspersed(false)
	f.StringVar(&attach, "attach", "", "reattach to this exec's terminal")
	f.StringVar(&after, "after", "", "with --attach: replay only the output after this cursor")
	f.StringArrayVar(&env, "env", nil, "an environment variable, NAME=VALUE (repeatable; TERM is yours unless set)")
	f.StringVar(&cwd, "cwd", "", "the working folder (default /workspace)")
	f.Int64Var(&timeout, "timeout-sec", 0, "end the shell after this many seconds (default a day, or the server's bound)")
	_ = cmd.RegisterFlagCompletionFunc("attach", a.completeExecs(client.ExecRunning))
	return cmd
}

// ttyState is sandboxctl's own terminal: stdin's descriptor when it is a terminal (raw mode,
// resizes), and the size to give the sandbox's.
type ttyState struct {
	in, out    int // descriptors; -1 when not a terminal
	rows, cols int
}

// tty finds sandboxctl's terminal; 24x80 when there is none.
func (a *app) tty() ttyState {
	st := ttyState{in: -1, out: -1, rows: 24, cols: 80}
	if f, ok := a.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		st.in = int(f.Fd())
	}
	if f, ok := a.stdout.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		st.out = int(f.Fd())
	}
	st.rows, st.cols = st.size()
	return st
}

// size is the terminal's size now, 24x80 when it cannot be told.
func (st ttyState) size() (int, int) {
	for _, fd := range []int{st.out, st.in} {
		if fd < 0 {
			continue
		}
		if cols, rows, err := term.GetSize(fd); err == nil && rows > 0 && cols > 0 {
			return rows, cols
		}
	}
	return 24, 80
}

// runTerminal attaches to an exec's terminal and carries it until the exec ends (its exit
// code), the detach key or an interrupt (130, with how to reattach), or an error.
func (a *app) runTerminal(ctx context.Context, c *client.Client, tt ttyState, sandboxID, execID, after string, reattach bool) error {
	var refused atomic.Pointer[error]
	t, err := c.Terminal(ctx, sandboxID, execID, client.TerminalOptions{After: after, OnError: func(err error) { refused.Store(&err) }})
	if err != nil {
		return err
	}
	defer t.Close()
	info := t.Info()
	if reattach && info.Tty != nil && info.State == client.ExecRunning && (info.Tty.Rows != tt.rows || info.Tty.Cols != tt.cols) {
		_ = t.Resize(tt.rows, tt.cols) // a refusal comes to OnError
	}
	if !a.json() {
		fmt.Fprintf(a.stderr, "sandboxctl: %s in %s; %s detaches\n", execID, sandboxID, detachKeyName)
	}

	restore := func() {}
	if tt.in >= 0 {
		old, err := term.MakeRaw(tt.in)
		if err != nil {
			return &os.PathError{Op: "raw mode", Path: "stdin", Err: err}
		}
		var once sync.Once
		restore = func() { once.Do(func() { _ = term.Restore(tt.in, old) }) }
	}
	defer restore()

	done := make(chan struct{})
	defer close(done)
	if tt.in >= 0 || tt.out >= 0 {
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for {
				select {
				case <-winch:
					rows, cols := tt.size()
					_ = t.Resize(rows, cols)
				case <-done:
					return
				}
			}
		}()
	}

	var detached atomic.Bool
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := a.stdin.Read(buf)
			if i := bytes.IndexByte(buf[:n], detachKey); i >= 0 {
				if i > 0 {
					_, _ = t.Write(buf[:i])
				}
				detached.Store(true)
				_ = t.Close()
				return
			}
			if n > 0 {
				if _, werr := t.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				if err == io.EOF && tt.in < 0 {
					_ = t.CloseStdin() // piped input ended: so does the command's
				}
				return
			}
		}
	}()

	buf := make([]byte, 64<<10)
	for {
		n, rerr := t.Read(buf)
		if n > 0 {
			if _, err := a.stdout.Write(buf[:n]); err != nil {
				restore()
				return err
			}
		}
		if rerr == nil {
			continue
		}
		restore()
		if p := refused.Load(); p != nil && !a.json() {
			fmt.Fprintf(a.stderr, "\nsandboxctl: the server refused input or a resize: %s\n", printable((*p).Error()))
		}
		switch {
		case rerr == io.EOF:
			return a.terminalExit(ctx, c, t, sandboxID, execID)
		case detached.Load() || ctx.Err() != nil:
			return a.terminalDetached(execID, t.Cursor())
		}
		a.reattachHint(execID, t.Cursor())
		return rerr
	}
}

// terminalExit ends sandboxctl with the exit of the terminal's exec.
func (a *app) terminalExit(ctx context.Context, c *client.Client, t *client.Terminal, sandboxID, execID string) error {
	var e client.Exec
	if x := t.Exit(); x != nil {
		e = client.Exec{ExecID: execID, SandboxID: sandboxID, State: client.ExecEnded, ExitCode: x.ExitCode, Signal: x.Signal,
			TimedOut: x.TimedOut, Error: x.Error}
	} else {
		var err error
		if e, err = c.ExecStatus(context.WithoutCancel(ctx), sandboxID, execID); err != nil {
			return err
		}
	}
	if a.json() {
		v := execView(e)
		writeLine(a.stderr, streamEvent{Event: "exit", Cursor: t.Cursor(), Exec: &v})
	}
	return a.exit(e)
}

// terminalDetached says how to reattach and ends with exitInterrupted.
func (a *app) terminalDetached(execID, cursor string) error {
	if a.json() {
		writeLine(a.stderr, streamEvent{Event: "detached", Cursor: cursor, ExecID: execID})
		return &exitStatus{exitInterrupted}
	}
	fmt.Fprintf(a.stderr, "\nsandboxctl: detached; %s runs on in the sandbox.\n", execID)
	a.reattachHint(execID, cursor)
	return &exitStatus{exitInterrupted}
}

func (a *app) reattachHint(execID, cursor string) {
	if a.json() {
		return
	}
	fmt.Fprintf(a.stderr, "reattach: sandboxctl terminal --attach %s", execID)
	if cursor != "" {
		fmt.Fprintf(a.stderr, " (replays its output; add --after %s for what follows only)", cursor)
	}
	fmt.Fprintln(a.stderr)
}
