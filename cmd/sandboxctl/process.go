package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"sandboxd/client"
)

func (a *app) execsCmd() *cobra.Command {
	var (
		opts  client.ListExecsOptions
		all   bool
		quiet bool
	)
	cmd := &cobra.Command{
		Use:   "execs SANDBOX",
		Short: "List a sandbox's commands, newest first",
		Long: `List a sandbox's execs, newest first: every running one, and the ended ones whose output the
server still keeps. --state RUNNING or ENDED keeps one kind.`,
		Example: `  sandboxctl execs $SANDBOX_ID
  sandboxctl execs $SANDBOX_ID --state RUNNING -q
  sandboxctl execs $SANDBOX_ID --all --output json`,
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeSandboxes(1),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			opts.State = strings.ToUpper(opts.State)
			c, err := a.client()
			if err != nil {
				return err
			}
			var out client.ExecPage
			for {
				page, err := c.ListExecs(cmd.Context(), args[0], opts)
				if err != nil {
					return err
				}
				out.Execs = append(out.Execs, page.Execs...)
				out.NextCursor = page.NextCursor
				if !all || page.NextCursor == "" || page.NextCursor == opts.Cursor {
					break
				}
				opts.Cursor = page.NextCursor
			}
			switch {
			case a.json():
				views := make([]execJSON, 0, len(out.Execs))
				for _, e := range out.Execs {
					views = append(views, execView(e))
				}
				writeJSON(a.stdout, struct {
					Execs      []execJSON `json:"execs"`
					NextCursor string     `json:"next_cursor,omitempty"`
				}{views, out.NextCursor})
			case quiet:
				for _, e := range out.Execs {
					fmt.Fprintln(a.stdout, e.ExecID)
				}
			default:
				rows := make([][]string, 0, len(out.Execs))
				for _, e := range out.Execs {
					rows = append(rows, []string{e.ExecID, e.State, exitColumn(e), when(e.StartedAt), ttyColumn(e), printable(e.Command)})
				}
				table(a.stdout, []string{"EXEC ID", "STATE", "EXIT", "STARTED", "TTY", "COMMAND"}, rows)
			}
			if out.NextCursor != "" && !a.json() {
				fmt.Fprintf(a.stderr, "more: sandboxctl execs %s --cursor %s (or --all)\n", args[0], out.NextCursor)
			}
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringVar(&opts.State, "state", "", "only execs in this state: RUNNING or ENDED")
	f.IntVar(&opts.Limit, "limit", 0, "execs per page (default: the server's, 50)")
	f.StringVar(&opts.Cursor, "cursor", "", "the page after this cursor (next_cursor of the previous page)")
	f.BoolVar(&all, "all", false, "every page")
	f.BoolVarP(&quiet, "quiet", "q", false, "print only the exec ids")
	_ = cmd.RegisterFlagCompletionFunc("state", cobra.FixedCompletions([]string{client.ExecRunning, client.ExecEnded}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// exitColumn is an exec's EXIT cell: its exit code, or the signal that killed it; - while it
// runs.
func exitColumn(e client.Exec) string {
	switch {
	case e.State != client.ExecEnded:
		return "-"
	case e.Signal != "":
		return printable(e.Signal)
	}
	return strconv.Itoa(e.ExitCode)
}

// ttyColumn is an exec's TTY cell: ROWSxCOLS, "stdin" for an open stdin without a terminal.
func ttyColumn(e client.Exec) string {
	switch {
	case e.Tty != nil:
		return fmt.Sprintf("%dx%d", e.Tty.Rows, e.Tty.Cols)
	case e.StdinOpen:
		return "stdin"
	}
	return "-"
}

// signals are the signals signal sends (the server's list), for completion and help.
var signals = []string{client.SIGTERM, client.SIGKILL, client.SIGINT, client.SIGHUP, client.SIGQUIT, client.SIGUSR1, client.SIGUSR2}

// signalName reads TERM, sigterm, SIGTERM or 15 as SIGTERM. The server decides which it takes.
func signalName(s string) (string, error) {
	if n, err := strconv.Atoi(s); err == nil {
		name := unix.SignalName(unix.Signal(n))
		if name == "" {
			return "", usagef("no signal numbered %d", n)
		}
		return name, nil
	}
	s = strings.ToUpper(s)
	if !strings.HasPrefix(s, "SIG") {
		s = "SIG" + s
	}
	if len(s) <= 3 || strings.IndexFunc(s, func(r rune) bool { return (r < 'A' || r > 'Z') && (r < '0' || r > '9') }) >= 0 {
		return "", usagef("%q is no signal name (SIGTERM, SIGKILL, SIGINT, SIGHUP, …)", s)
	}
	return s, nil
}

func (a *app) signalCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "signal EXEC [SIGNAL]",
		Short: "Send a signal to a running command and every process it started",
		Long: `Send a signal (default SIGTERM) to a running exec's whole process tree. SIGNAL is a name
(SIGTERM, TERM, term) or a number (15). The command then ends as it handles the signal; its
status, and exit code once it ended, come with logs or execs.`,
		Example: `  sandboxctl signal exec_01J… SIGINT
  sandboxctl signal exec_01J… KILL`,
		Args:              rangeArgs(1, 2),
		ValidArgsFunction: a.completeSignal,
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			sig := client.SIGTERM
			if len(args) == 2 {
				var err error
				if sig, err = signalName(args[1]); err != nil {
					return err
				}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			e, err := c.ExecByID(cmd.Context(), args[0], false)
			if err != nil {
				return err
			}
			st, err := c.SignalExec(cmd.Context(), e.SandboxID, e.ExecID, sig)
			if err != nil {
				return err
			}
			if a.json() {
				writeJSON(a.stdout, execView(st))
				return nil
			}
			fmt.Fprintf(a.stdout, "sent %s to %s (%s)\n", sig, st.ExecID, st.State)
			return nil
		}),
	}
	return cmd
}

// completeSignal completes a running exec id, then a signal name.
func (a *app) completeSignal(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	switch len(args) {
	case 0:
		return a.execIDs(cmd, toComplete, client.ExecRunning), cobra.ShellCompDirectiveNoFileComp
	case 1:
		return signals, cobra.ShellCompDirectiveNoFileComp
	}
	return nil, cobra.ShellCompDirectiveNoFileComp
}

// completeExecs completes the first argument with the caller's exec ids in state ("": any).
func (a *app) completeExecs(state string) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return a.execIDs(cmd, toComplete, state), cobra.ShellCompDirectiveNoFileComp
	}
}

// completionSandboxes bounds how many running sandboxes exec completion asks for their execs.
const completionSandboxes = 20

// execIDs are the ids, with prefix, of the execs in state of the caller's newest running
// sandboxes, each described by its sandbox and command.
func (a *app) execIDs(cmd *cobra.Command, prefix, state string) []cobra.Completion {
	c, err := a.client()
	if err != nil {
		return nil
	}
	page, err := c.List(cmd.Context(), client.ListOptions{State: client.StateRunning, Limit: completionSandboxes})
	if err != nil {
		return nil
	}
	var out []cobra.Completion
	for _, sb := range page.Sandboxes {
		execs, err := c.ListExecs(cmd.Context(), sb.ID, client.ListExecsOptions{State: state, Limit: 100})
		if err != nil {
			continue
		}
		for _, e := range execs.Execs {
			if strings.HasPrefix(e.ExecID, prefix) {
				out = append(out, cobra.CompletionWithDesc(e.ExecID, sb.ID+" "+e.State+" "+completionText(e.Command)))
			}
		}
	}
	return out
}

// completionText is s on one line without control characters, at most 60 runes.
func completionText(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if r := []rune(s); len(r) > 60 {
		s = string(r[:59]) + "…"
	}
	return s
}
