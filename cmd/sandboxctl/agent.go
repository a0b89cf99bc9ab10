package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"sandboxd/client"
)

func (a *app) agentCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "agent",
		Aliases: []string{"agents"},
		Short:   "Start, follow and cancel agent runs in a sandbox",
		Args:    noArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	var (
		req                        client.AgentRunRequest
		instrFile, config, cfgFile string
	)
	start := &cobra.Command{
		Use:   "start SANDBOX",
		Short: "Start a catalog agent in a running sandbox",
		Example: `  sandboxctl agent start $SANDBOX_ID --agent opencode --model wandb/moonshotai/Kimi-K2.5 \
    --instruction 'Continue from the current files and fix the next failure'`,
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeSandboxes(1),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			if (req.Instruction == "") == (instrFile == "") {
				return usagef("give the instruction with exactly one of --instruction and --instruction-file")
			}
			if config != "" && cfgFile != "" {
				return usagef("--config and --config-file exclude each other")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if instrFile != "" {
				b, err := readBounded(instrFile, 1<<20)
				if err != nil {
					return err
				}
				req.Instruction = string(b)
			}
			if cfgFile != "" {
				b, err := readBounded(cfgFile, 1<<20)
				if err != nil {
					return err
				}
				config = string(b)
			}
			if config != "" {
				if !json.Valid([]byte(config)) {
					return usagef("the agent's config is not JSON")
				}
				req.Config = json.RawMessage(config)
			}
			req.SandboxID = args[0]
			r, err := c.StartAgentRun(cmd.Context(), req)
			if err != nil {
				return err
			}
			a.printRun(r)
			return nil
		}),
	}
	f := start.Flags()
	f.StringVar(&req.AgentID, "agent", "", "the catalog agent (e.g. opencode)")
	f.StringVar(&req.Model, "model", "", "the model the agent uses")
	f.StringVar(&req.Instruction, "instruction", "", "the instruction")
	f.StringVar(&instrFile, "instruction-file", "", "read the instruction from this file")
	f.StringVar(&config, "config", "", "the agent's config, a JSON object")
	f.StringVar(&cfgFile, "config-file", "", "read the agent's config from this JSON file")
	_ = start.MarkFlagRequired("agent")

	get := &cobra.Command{
		Use:   "get RUN",
		Short: "Show an agent run",
		Args:  exactArgs(1),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			r, err := c.AgentRun(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			a.printRun(r)
			return nil
		}),
	}
	list := &cobra.Command{
		Use:               "list SANDBOX",
		Aliases:           []string{"ls"},
		Short:             "List a sandbox's agent runs, newest first",
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeSandboxes(1),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			runs, err := c.AgentRuns(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.json() {
				if runs == nil {
					runs = []client.AgentRun{}
				}
				writeJSON(a.stdout, map[string]any{"runs": runs})
				return nil
			}
			rows := make([][]string, 0, len(runs))
			for _, r := range runs {
				rows = append(rows, []string{r.ID, r.AgentID, r.Status, when(r.CreatedAt), orDash(r.ExecID)})
			}
			table(a.stdout, []string{"RUN ID", "AGENT", "STATUS", "CREATED", "EXEC ID"}, rows)
			return nil
		}),
	}
	cancel := &cobra.Command{
		Use:   "cancel RUN",
		Short: "Cancel an agent run: its whole process tree is killed",
		Args:  exactArgs(1),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			r, err := c.CancelAgentRun(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			a.printRun(r)
			return nil
		}),
	}
	var after string
	logs := &cobra.Command{
		Use:   "logs RUN",
		Short: "Follow an agent run: its output, and its status on stderr, until it is final",
		Args:  exactArgs(1),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			s, err := c.AgentRunEvents(cmd.Context(), args[0], after)
			if err != nil {
				return err
			}
			defer s.Close()
			for {
				ev, err := s.Next()
				if err == io.EOF {
					return nil
				}
				if err != nil {
					return err
				}
				if a.json() {
					line := streamEvent{Event: ev.Kind, Cursor: ev.Cursor}
					switch ev.Kind {
					case client.KindChunk:
						line = chunkEvent(ev)
					case client.KindTruncated:
						line.MissedBytes = &ev.MissedBytes
					case client.KindStatus:
						line.Run = ev.Run
					}
					writeLine(a.stdout, line)
					continue
				}
				switch ev.Kind {
				case client.KindChunk:
					w := a.stdout
					if ev.Stream == "stderr" {
						w = a.stderr
					}
					_, _ = w.Write(ev.Data)
				case client.KindTruncated:
					fmt.Fprintf(a.stderr, "\nsandboxctl: %d bytes of output are no longer kept; the newest output follows\n", ev.MissedBytes)
				case client.KindStatus:
					fmt.Fprintf(a.stderr, "sandboxctl: %s is %s%s\n", ev.Run.ID, ev.Run.Status, reason(ev.Run.Reason))
				}
			}
		}),
	}
	logs.Flags().StringVar(&after, "after", "", "start after this cursor")
	cmd.AddCommand(start, get, list, cancel, logs)
	return cmd
}

func reason(r string) string {
	if r == "" {
		return ""
	}
	return " (" + r + ")"
}

func (a *app) printRun(r client.AgentRun) {
	if a.json() {
		writeJSON(a.stdout, r)
		return
	}
	exit := ""
	if r.ExitCode != nil {
		exit = strconv.Itoa(*r.ExitCode)
	}
	fields(a.stdout, "run_id", r.ID, "sandbox_id", r.SandboxID, "agent_id", r.AgentID, "model", r.Model,
		"status", r.Status, "reason", r.Reason, "exec_id", r.ExecID, "exit_code", exit, "signal", r.Signal,
		"run_dir", r.RunDir, "created_at", when(r.CreatedAt), "started_at", whenPtr(r.StartedAt), "ended_at", whenPtr(r.EndedAt))
}

// readBounded reads a local file of at most max bytes.
func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, usagef("%s is larger than %d bytes", path, max)
	}
	return b, nil
}
