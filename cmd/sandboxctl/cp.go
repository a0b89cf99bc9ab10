package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"sandboxd/client"
)

func (a *app) cpCmd() *cobra.Command {
	var opts client.CopyOptions
	var verbose bool
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and folders into and out of a sandbox",
		Long: `Copy a file, or a folder with everything in it, between this machine and a sandbox's
workspace. One side is SANDBOX:PATH (a relative PATH is relative to /workspace); the other is a
local path, or - for standard input or output (one file). As cp: into DST when it is a folder
(or ends with /), else to DST itself.

Links are never followed: a local link named as the source is refused, links and special files
inside a folder are skipped and listed; local writes go through the destination folder only
(an existing link there is replaced, its target untouched). The sandbox side is the server's
to resolve: a path that leaves the workspace, through .. or a link, is its INVALID_ARGUMENT,
and a link where a file lands there is replaced by the file, its target never written.
A local name with a colon is written ./NAME.`,
		Example: `  sandboxctl cp ./src $SANDBOX_ID:/workspace/
  sandboxctl cp ./test_ok.py $SANDBOX_ID:tests/test_ok.py
  sandboxctl cp $SANDBOX_ID:/workspace/out ./out
  sandboxctl cp $SANDBOX_ID:report.json -`,
		Args:              exactArgs(2),
		ValidArgsFunction: a.completeCp,
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			src, dst := parseCpArg(args[0]), parseCpArg(args[1])
			switch {
			case src.sandbox != "" && dst.sandbox != "":
				return usagef("cp copies between this machine and a sandbox: one side is SANDBOX:PATH, not both")
			case src.sandbox == "" && dst.sandbox == "":
				return usagef("cp wants one side as SANDBOX:PATH (a local name with a colon is written ./NAME)")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if verbose {
				opts.OnFile = func(f client.CopiedFile) {
					if f.Skipped == "" && !f.IsDir {
						fmt.Fprintf(a.stderr, "%s -> %s (%s)\n", printable(pick(src.sandbox != "", f.Remote, f.Local)),
							printable(pick(src.sandbox != "", f.Local, f.Remote)), size(f.Size))
					}
				}
			}
			ctx := cmd.Context()
			switch {
			case src.sandbox == "" && src.path == "-":
				fi, err := c.WriteFile(ctx, dst.sandbox, dst.path, a.stdin, 0)
				if err != nil {
					return err
				}
				if a.json() {
					writeJSON(a.stdout, fi)
				} else {
					fmt.Fprintf(a.stdout, "wrote %s to %s:%s\n", size(fi.Size), dst.sandbox, fi.Path)
				}
				return nil
			case dst.sandbox == "" && dst.path == "-":
				rc, err := c.OpenFile(ctx, src.sandbox, src.path)
				if err != nil {
					return err
				}
				defer rc.Close()
				_, err = io.Copy(a.stdout, rc)
				return err
			}
			var res client.CopyResult
			where := ""
			if src.sandbox != "" {
				res, err = c.CopyOut(ctx, src.sandbox, src.path, dst.path, opts)
			} else {
				res, err = c.CopyIn(ctx, dst.sandbox, src.path, dst.path, opts)
				where = dst.sandbox + ":"
			}
			if err != nil {
				return err
			}
			if a.json() {
				writeJSON(a.stdout, res)
				return nil
			}
			for _, s := range res.Skipped {
				fmt.Fprintf(a.stderr, "skipped %s: %s\n", printable(pick(src.sandbox != "", s.Remote, s.Local)), printable(s.Skipped))
			}
			fmt.Fprintf(a.stdout, "copied %d file(s), %s, and %d folder(s) to %s%s\n", res.Files, size(res.Bytes), res.Dirs, where, res.Dest)
			return nil
		}),
	}
	f := cmd.Flags()
	f.IntVar(&opts.MaxFiles, "max-files", client.DefaultCopyMaxFiles, "refuse to copy more files and folders than this")
	f.Int64Var(&opts.MaxBytes, "max-bytes", client.DefaultCopyMaxBytes, "refuse to copy more bytes than this, all files together")
	f.BoolVarP(&verbose, "verbose", "v", false, "name every file as it is copied (on stderr)")
	return cmd
}

// cpArg is one side of cp: a sandbox and its path, or a local path (sandbox "").
type cpArg struct{ sandbox, path string }

// parseCpArg reads SANDBOX:PATH; anything else (a path with a slash before its first colon,
// one that starts with a dot or a slash, -) is local.
func parseCpArg(s string) cpArg {
	id, p, ok := strings.Cut(s, ":")
	if !ok || id == "" || strings.ContainsAny(id, "/\\") || strings.HasPrefix(id, ".") {
		return cpArg{path: s}
	}
	if p == "" {
		p = "."
	}
	return cpArg{sandbox: id, path: p}
}

func pick(cond bool, a, b string) string {
	if cond {
		return a
	}
	return b
}

// completeCp offers SANDBOX: for an argument that is not a path yet, files otherwise.
func (a *app) completeCp(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) >= 2 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	if strings.ContainsAny(toComplete, "/:.") {
		return nil, cobra.ShellCompDirectiveDefault
	}
	ids := a.sandboxIDs(cmd, toComplete, ":")
	if len(ids) == 0 {
		return nil, cobra.ShellCompDirectiveDefault
	}
	return ids, cobra.ShellCompDirectiveNoSpace
}
