package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"sandboxd/client"
)

func (a *app) createCmd() *cobra.Command {
	var (
		req                        client.CreateRequest
		autostop, ttl              int64
		env, labels                []string
		snapshot, archive, gcsPref string
		quiet                      bool
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a sandbox and wait until it runs",
		Long: `Create a sandbox from a profile and wait until it is RUNNING (with a source, until its
workspace is filled). It takes one concurrency slot of the tenant:project.`,
		Example: `  sandboxctl create
  sandboxctl create --profile sandboxes-default --autostop-sec 1800 --ttl-sec 14400 --env LANG=C.UTF-8
  sandboxctl create --snapshot snap_01J…_0000000002
  sandboxctl create --label team=ml --label example.com/ticket=T-42
  export SANDBOX_ID=$(sandboxctl create -q)`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if req.Env, err = splitKV("env", env); err != nil {
				return err
			}
			if req.Labels, err = parseLabels("label", labels); err != nil {
				return err
			}
			if cmd.Flags().Changed("autostop-sec") {
				req.AutostopSec = &autostop
			}
			if cmd.Flags().Changed("ttl-sec") {
				req.TTLSec = &ttl
			}
			if snapshot != "" || archive != "" || gcsPref != "" {
				req.Source = &client.Source{SnapshotID: snapshot, ArchiveURL: archive, GCSPrefix: gcsPref}
			}
			sb, err := c.Create(cmd.Context(), req)
			if err != nil {
				return err
			}
			if quiet {
				fmt.Fprintln(a.stdout, sb.ID)
				return nil
			}
			a.printSandbox(sb)
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringVar(&req.Profile, "profile", "", "the profile (default: the server's default profile)")
	f.Int64Var(&autostop, "autostop-sec", 0, "stop after this many seconds without activity (default: the server's, 1800)")
	f.Int64Var(&ttl, "ttl-sec", 0, "destroy this many seconds after creation (default: the server's, 86400)")
	f.StringArrayVar(&env, "env", nil, "an environment variable of every command, NAME=VALUE (repeatable)")
	f.StringArrayVar(&labels, "label", nil, "a label, KEY=VALUE (repeatable; Kubernetes' label syntax, at most 32)")
	f.StringVar(&snapshot, "snapshot", "", "fill the workspace from this snapshot of the tenant:project")
	f.StringVar(&archive, "archive-url", "", "fill the workspace from this HTTPS archive (zip, tar, tar.gz, tar.zst)")
	f.StringVar(&gcsPref, "gcs-prefix", "", "fill the workspace from the objects under gs://bucket/prefix/")
	f.BoolVarP(&quiet, "quiet", "q", false, "print only the sandbox id")
	f.StringVar(&req.AutostopAction, "autostop-action", "", "what idle auto-stop does: stop (the default) or pause (keep the processes)")
	f.BoolVar(&req.AutoResume, "auto-resume", false, "let exec and file calls resume the sandbox when it is PAUSED")
	_ = cmd.RegisterFlagCompletionFunc("autostop-action", cobra.FixedCompletions([]string{"stop", "pause"}, cobra.ShellCompDirectiveNoFileComp))
	cmd.MarkFlagsMutuallyExclusive("snapshot", "archive-url", "gcs-prefix")
	_ = cmd.RegisterFlagCompletionFunc("snapshot", a.completeSnapshots)
	return cmd
}

func (a *app) listCmd() *cobra.Command {
	var (
		opts   client.ListOptions
		all    bool
		quiet  bool
		labels []string
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List sandboxes, newest first",
		Example: `  sandboxctl list
  sandboxctl list --state RUNNING --output json
  sandboxctl list --label team=ml --label env=prod
  sandboxctl list --all -q`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			opts.State = strings.ToUpper(opts.State)
			if opts.Labels, err = parseLabels("label", labels); err != nil {
				return err
			}
			var out client.Page
			for {
				page, err := c.List(cmd.Context(), opts)
				if err != nil {
					return err
				}
				out.Sandboxes = append(out.Sandboxes, page.Sandboxes...)
				out.NextCursor = page.NextCursor
				if !all || page.NextCursor == "" || page.NextCursor == opts.Cursor {
					break // the last page (or a server that answers the same page again)
				}
				opts.Cursor = page.NextCursor
			}
			if out.Sandboxes == nil {
				out.Sandboxes = []client.Sandbox{}
			}
			switch {
			case a.json():
				writeJSON(a.stdout, out)
			case quiet:
				for _, sb := range out.Sandboxes {
					fmt.Fprintln(a.stdout, sb.ID)
				}
			default:
				rows := make([][]string, 0, len(out.Sandboxes))
				for _, sb := range out.Sandboxes {
					rows = append(rows, []string{sb.ID, sb.State, sb.Profile, when(sb.CreatedAt), orDash(whenPtr(sb.AutostopAt)), orDash(whenPtr(sb.ExpiresAt)),
						labelColumn(sb.Labels)})
				}
				table(a.stdout, []string{"SANDBOX ID", "STATE", "PROFILE", "CREATED", "AUTOSTOP AT", "EXPIRES AT", "LABELS"}, rows)
			}
			if out.NextCursor != "" && !a.json() {
				fmt.Fprintf(a.stderr, "more: sandboxctl list --cursor %s (or --all)\n", out.NextCursor)
			}
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringVar(&opts.State, "state", "", "only sandboxes in this state (RUNNING, STOPPED, …)")
	f.IntVar(&opts.Limit, "limit", 0, "sandboxes per page (default: the server's, 50; at most 500)")
	f.StringVar(&opts.Cursor, "cursor", "", "the page after this cursor (next_cursor of the previous page)")
	f.StringArrayVar(&labels, "label", nil, "only sandboxes with this label, KEY=VALUE (repeatable, ANDed)")
	f.BoolVar(&all, "all", false, "every page")
	f.BoolVarP(&quiet, "quiet", "q", false, "print only the sandbox ids")
	_ = cmd.RegisterFlagCompletionFunc("state", cobra.FixedCompletions([]string{client.StateCreating, client.StateRunning,
		client.StateStopping, client.StateStopped, client.StateStarting, client.StateDestroying, client.StateDestroyed,
		client.StateFailed, client.StateExpired, client.StatePausing, client.StatePaused, client.StateResuming}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func (a *app) getCmd() *cobra.Command {
	return a.sandboxVerb("get SANDBOX", "Show a sandbox", func(c *client.Client, cmd *cobra.Command, id string) (client.Sandbox, error) {
		return c.Get(cmd.Context(), id)
	})
}

func (a *app) stopCmd() *cobra.Command {
	return a.sandboxVerb("stop SANDBOX", "Checkpoint a sandbox's workspace and release its compute (STOPPED)",
		func(c *client.Client, cmd *cobra.Command, id string) (client.Sandbox, error) {
			return c.Stop(cmd.Context(), id)
		})
}

func (a *app) startCmd() *cobra.Command {
	return a.sandboxVerb("start SANDBOX", "Restore a stopped sandbox's workspace (RUNNING)",
		func(c *client.Client, cmd *cobra.Command, id string) (client.Sandbox, error) {
			return c.Start(cmd.Context(), id)
		})
}

func (a *app) pauseCmd() *cobra.Command {
	return a.sandboxVerb("pause SANDBOX", "Keep a sandbox's memory, processes and workspace and release its compute (PAUSED)",
		func(c *client.Client, cmd *cobra.Command, id string) (client.Sandbox, error) {
			return c.Pause(cmd.Context(), id)
		})
}

func (a *app) resumeCmd() *cobra.Command {
	return a.sandboxVerb("resume SANDBOX", "Bring a paused sandbox back with its processes (RUNNING)",
		func(c *client.Client, cmd *cobra.Command, id string) (client.Sandbox, error) {
			return c.Resume(cmd.Context(), id)
		})
}

func (a *app) destroyCmd() *cobra.Command {
	cmd := a.sandboxVerb("destroy SANDBOX", "Checkpoint a sandbox one last time and remove it (DESTROYED)",
		func(c *client.Client, cmd *cobra.Command, id string) (client.Sandbox, error) {
			return c.Destroy(cmd.Context(), id)
		})
	cmd.Aliases = []string{"delete"} // not rm: that deletes files
	return cmd
}

// autoResume prints a sandbox's auto_resume: "true", or "" (not shown) when it is off.
func autoResume(sb client.Sandbox) string {
	if sb.AutoResume {
		return "true"
	}
	return ""
}

// sandboxVerb is a command that takes one sandbox id and answers the sandbox.
func (a *app) sandboxVerb(use, short string, do func(*client.Client, *cobra.Command, string) (client.Sandbox, error)) *cobra.Command {
	return &cobra.Command{
		Use:               use,
		Short:             short,
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeSandboxes(1),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := do(c, cmd, args[0])
			if err != nil {
				return err
			}
			a.printSandbox(sb)
			return nil
		}),
	}
}

func (a *app) quotaCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "quota",
		Short: "Show the tenant:project's concurrency slots",
		Args:  noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			q, err := c.Quota(cmd.Context())
			if err != nil {
				return err
			}
			if a.json() {
				writeJSON(a.stdout, q)
				return nil
			}
			limit := strconv.Itoa(q.Limit)
			if q.Limit == 0 {
				limit = "unlimited"
			}
			fields(a.stdout, "in use", strconv.Itoa(q.InUse), "limit", limit)
			return nil
		}),
	}
}

func (a *app) printSandbox(sb client.Sandbox) {
	if a.json() {
		writeJSON(a.stdout, sb)
		return
	}
	fields(a.stdout,
		"sandbox_id", sb.ID,
		"state", sb.State,
		"state_reason", sb.StateReason,
		"profile", sb.Profile,
		"tenant/project", sb.TenantID+"/"+sb.ProjectID,
		"created_at", when(sb.CreatedAt),
		"state_changed_at", when(sb.StateChangedAt),
		"autostop_sec", strconv.FormatInt(sb.AutostopSec, 10),
		"autostop_at", whenPtr(sb.AutostopAt),
		"ttl_sec", strconv.FormatInt(sb.TTLSec, 10),
		"expires_at", whenPtr(sb.ExpiresAt),
		"resources", fmt.Sprintf("%d milli-CPU, %s memory, %s disk", sb.Resources.MilliCPU, size(sb.Resources.MemoryBytes), size(sb.Resources.DiskBytes)),
		"network", sb.Network,
		"labels", labelList(sb.Labels, ", "),
		"autostop_action", sb.AutostopAction,
		"auto_resume", autoResume(sb),
		"latest_snapshot_id", sb.LatestSnapshotID,
		"snapshot_id", sb.SnapshotID,
	)
}

// ---- arguments ----

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), args)
	}
	return nil
}

func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s wants %d argument(s) (%s), got %d", cmd.CommandPath(), n, cmd.Use, len(args))
		}
		return nil
	}
}

func rangeArgs(lo, hi int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < lo || len(args) > hi {
			return usagef("%s wants %d to %d arguments (%s), got %d", cmd.CommandPath(), lo, hi, cmd.Use, len(args))
		}
		return nil
	}
}

// ---- completion ----

// completeSandboxes completes the first n arguments with the caller's sandbox ids.
func (a *app) completeSandboxes(n int) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) >= n {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return a.sandboxIDs(cmd, toComplete, ""), cobra.ShellCompDirectiveNoFileComp
	}
}

// sandboxIDs are the ids of the caller's newest sandboxes that start with prefix, each with
// suffix and its state as the description.
func (a *app) sandboxIDs(cmd *cobra.Command, prefix, suffix string) []cobra.Completion {
	c, err := a.client()
	if err != nil {
		return nil
	}
	page, err := c.List(cmd.Context(), client.ListOptions{Limit: 200})
	if err != nil {
		return nil
	}
	var out []cobra.Completion
	for _, sb := range page.Sandboxes {
		if strings.HasPrefix(sb.ID, prefix) && sb.State != client.StateDestroyed {
			out = append(out, cobra.CompletionWithDesc(sb.ID+suffix, sb.State+" "+sb.Profile))
		}
	}
	return out
}

func (a *app) completeSnapshots(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	c, err := a.client()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	snaps, err := c.Snapshots(cmd.Context(), "", 200)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []cobra.Completion
	for _, s := range snaps {
		if strings.HasPrefix(s.ID, toComplete) {
			out = append(out, cobra.CompletionWithDesc(s.ID, s.SandboxID+" "+when(s.CreatedAt)))
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
