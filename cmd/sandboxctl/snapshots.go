package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"sandboxd/client"
)

func (a *app) snapshotCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "snapshot",
		Aliases: []string{"snapshots"},
		Short:   "Take, list and delete workspace snapshots",
		Args:    noArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	create := &cobra.Command{
		Use:               "create SANDBOX",
		Short:             "Snapshot a running sandbox's workspace (it keeps running)",
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeSandboxes(1),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			s, err := c.Snapshot(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.json() {
				writeJSON(a.stdout, s)
				return nil
			}
			fields(a.stdout, "snapshot_id", s.ID, "sandbox_id", s.SandboxID, "created_at", when(s.CreatedAt),
				"size", fmt.Sprintf("%s (%s unpacked)", size(s.SizeBytes), size(s.RawSizeBytes)), "sha256", s.SHA256,
				"parent_snapshot_id", s.ParentSnapshotID)
			return nil
		}),
	}
	var limit int
	list := &cobra.Command{
		Use:               "list [SANDBOX]",
		Aliases:           []string{"ls"},
		Short:             "List one sandbox's snapshots, or the whole project's, newest first",
		Args:              rangeArgs(0, 1),
		ValidArgsFunction: a.completeSandboxes(1),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			id := ""
			if len(args) == 1 {
				id = args[0]
			}
			snaps, err := c.Snapshots(cmd.Context(), id, limit)
			if err != nil {
				return err
			}
			if a.json() {
				if snaps == nil {
					snaps = []client.Snapshot{}
				}
				writeJSON(a.stdout, map[string]any{"snapshots": snaps})
				return nil
			}
			rows := make([][]string, 0, len(snaps))
			for _, s := range snaps {
				rows = append(rows, []string{s.ID, s.SandboxID, when(s.CreatedAt), size(s.SizeBytes), orDash(s.ParentSnapshotID)})
			}
			table(a.stdout, []string{"SNAPSHOT ID", "SANDBOX ID", "CREATED", "SIZE", "PARENT"}, rows)
			return nil
		}),
	}
	list.Flags().IntVar(&limit, "limit", 0, "at most this many (default: the server's, 50; at most 500)")
	del := &cobra.Command{
		Use:               "delete SNAPSHOT",
		Aliases:           []string{"rm"},
		Short:             "Delete a snapshot (not the latest of a sandbox that is not running)",
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeSnapshots,
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if err := c.DeleteSnapshot(cmd.Context(), args[0]); err != nil {
				return err
			}
			if a.json() {
				writeJSON(a.stdout, map[string]any{"snapshot_id": args[0], "deleted": true})
			} else {
				fmt.Fprintf(a.stdout, "deleted %s\n", args[0])
			}
			return nil
		}),
	}
	cmd.AddCommand(create, list, del)
	return cmd
}
