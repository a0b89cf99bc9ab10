package main

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"sandboxd/client"
)

// parseLabels reads repeated --label KEY=VALUE flags (an empty VALUE is a label too). The
// server checks the syntax; a key given twice with two values is a usage error here, as it
// would be ambiguous.
func parseLabels(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usagef("--%s wants KEY=VALUE, got %q", flag, kv)
		}
		if old, dup := out[k]; dup && old != v {
			return nil, usagef("--%s names %q twice, with %q and %q", flag, k, old, v)
		}
		out[k] = v
	}
	return out, nil
}

// labelList is a sandbox's labels as one line, KEY=VALUE in key order, quoted when a label
// holds control characters (the server refuses them; a hostile server is not trusted to).
func labelList(labels map[string]string, sep string) string {
	parts := make([]string, 0, len(labels))
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, printable(k+"="+labels[k]))
	}
	return strings.Join(parts, sep)
}

func (a *app) updateCmd() *cobra.Command {
	var (
		set, remove   []string
		clear         bool
		autostop, ttl int64
	)
	cmd := &cobra.Command{
		Use:   "update SANDBOX",
		Short: "Change a sandbox's labels, auto-stop or TTL, and print its new deadlines",
		Long: `Change a live sandbox's labels, its auto-stop and its TTL (PATCH, a merge patch): --label
sets or changes a label, --remove-label removes one, the labels named in neither stay.
--clear-labels removes every label; with --label too, every label but those (sandboxctl reads
the labels first, then sends one patch). --autostop-sec and --ttl-sec replace the sandbox's,
within the server's bounds; the TTL still counts from the creation. It prints the sandbox's
labels and new deadlines (auto-stop counted from this call).`,
		Example: `  sandboxctl update $SANDBOX_ID --label env=staging --remove-label example.com/ticket
  sandboxctl update $SANDBOX_ID --autostop-sec 600 --ttl-sec 28800
  sandboxctl update $SANDBOX_ID --clear-labels --label team=ml`,
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeSandboxes(1),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			var req client.UpdateRequest
			var err error
			if req.SetLabels, err = parseLabels("label", set); err != nil {
				return err
			}
			for _, k := range remove {
				if k == "" || strings.Contains(k, "=") {
					return usagef("--remove-label wants a KEY, got %q", k)
				}
				if _, both := req.SetLabels[k]; both {
					return usagef("--label and --remove-label both name %q", k)
				}
			}
			req.RemoveLabels = remove
			if cmd.Flags().Changed("autostop-sec") {
				req.AutostopSec = &autostop
			}
			if cmd.Flags().Changed("ttl-sec") {
				req.TTLSec = &ttl
			}
			if !clear && req.SetLabels == nil && len(remove) == 0 && req.AutostopSec == nil && req.TTLSec == nil {
				return usagef("update wants at least one of --label, --remove-label, --clear-labels, --autostop-sec, --ttl-sec")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			switch {
			case clear && req.SetLabels == nil:
				req.ClearLabels = true
			case clear:
				// A merge patch cannot clear and set at once: remove every other label by name.
				sb, err := c.Get(ctx, args[0])
				if err != nil {
					return err
				}
				for k := range sb.Labels {
					if _, keep := req.SetLabels[k]; !keep {
						req.RemoveLabels = append(req.RemoveLabels, k)
					}
				}
			}
			sb, err := c.Update(ctx, args[0], req)
			if err != nil {
				return err
			}
			if a.json() {
				writeJSON(a.stdout, sb)
				return nil
			}
			fields(a.stdout,
				"sandbox_id", sb.ID,
				"state", sb.State,
				"labels", orDash(labelList(sb.Labels, ", ")),
				"autostop_sec", strconv.FormatInt(sb.AutostopSec, 10),
				"autostop_at", orDash(whenPtr(sb.AutostopAt)),
				"ttl_sec", strconv.FormatInt(sb.TTLSec, 10),
				"expires_at", orDash(whenPtr(sb.ExpiresAt)),
			)
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringArrayVar(&set, "label", nil, "set a label, KEY=VALUE (repeatable)")
	f.StringArrayVar(&remove, "remove-label", nil, "remove a label, KEY (repeatable)")
	f.BoolVar(&clear, "clear-labels", false, "remove every label (but those --label sets)")
	f.Int64Var(&autostop, "autostop-sec", 0, "stop after this many seconds without activity")
	f.Int64Var(&ttl, "ttl-sec", 0, "destroy this many seconds after creation")
	cmd.MarkFlagsMutuallyExclusive("clear-labels", "remove-label")
	return cmd
}

// labelColumn is the LABELS cell of list: the labels, or - for none.
func labelColumn(labels map[string]string) string {
	if len(labels) == 0 {
		return "-"
	}
	return labelList(labels, ",")
}
