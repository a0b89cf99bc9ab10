package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"sandboxd/client"
)

// remoteArg reads an argument that must be SANDBOX:PATH.
func remoteArg(cmd *cobra.Command, s string) (cpArg, error) {
	r := parseCpArg(s)
	if r.sandbox == "" {
		return r, usagef("%s wants SANDBOX:PATH, got %q", cmd.CommandPath(), s)
	}
	return r, nil
}

// remoteArgs parses every argument with remoteArg, all before anything is sent.
func remoteArgs(cmd *cobra.Command, args []string) ([]cpArg, error) {
	targets := make([]cpArg, 0, len(args))
	for _, s := range args {
		r, err := remoteArg(cmd, s)
		if err != nil {
			return nil, err
		}
		targets = append(targets, r)
	}
	return targets, nil
}

// completeRemote offers SANDBOX: for every argument.
func (a *app) completeRemote(max int) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if max > 0 && len(args) >= max {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		if parseCpArg(toComplete).sandbox != "" {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return a.sandboxIDs(cmd, toComplete, ":"), cobra.ShellCompDirectiveNoSpace | cobra.ShellCompDirectiveNoFileComp
	}
}

func (a *app) rmCmd() *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   "rm [-r] SANDBOX:PATH...",
		Short: "Delete files, links and folders in a sandbox",
		Long: `Delete a file, a symbolic link (never what it points to) or an empty folder in a sandbox's
workspace; a folder with entries only with -r. A relative PATH is relative to /workspace; a
path that leaves the workspace, through .. or a link, is the server's INVALID_ARGUMENT, and
/workspace itself cannot be deleted.`,
		Example: `  sandboxctl rm $SANDBOX_ID:out/report.json
  sandboxctl rm -r $SANDBOX_ID:build $SANDBOX_ID:.cache`,
		Args:              minArgs(1),
		ValidArgsFunction: a.completeRemote(0),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			targets, err := remoteArgs(cmd, args)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			for _, r := range targets {
				if err := c.DeleteFile(cmd.Context(), r.sandbox, r.path, recursive); err != nil {
					return err
				}
				if a.json() {
					writeLine(a.stdout, map[string]any{"sandbox_id": r.sandbox, "path": r.path, "deleted": true})
				}
			}
			return nil
		}),
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "delete folders with everything in them")
	return cmd
}

func (a *app) mvCmd() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "mv SANDBOX:FROM [SANDBOX:]TO",
		Short: "Move or rename a file or folder within a sandbox",
		Long: `Move or rename a file, folder or link within one sandbox's workspace. TO is the new name
itself (not a folder to move into); an existing TO is ALREADY_EXISTS unless -f. Both paths are
resolved as every file call is: nothing leaves the workspace.`,
		Example: `  sandboxctl mv $SANDBOX_ID:out/report.json $SANDBOX_ID:out/report-1.json
  sandboxctl mv -f $SANDBOX_ID:build.new build`,
		Args:              exactArgs(2),
		ValidArgsFunction: a.completeRemote(2),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			from, err := remoteArg(cmd, args[0])
			if err != nil {
				return err
			}
			to := parseCpArg(args[1])
			switch {
			case to.sandbox == "":
				to = cpArg{sandbox: from.sandbox, path: args[1]}
			case to.sandbox != from.sandbox:
				return usagef("mv moves within one sandbox: %s and %s differ (copy between sandboxes with cp)", from.sandbox, to.sandbox)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			fi, err := c.MoveFile(cmd.Context(), from.sandbox, from.path, to.path, force)
			if err != nil {
				return err
			}
			if a.json() {
				writeJSON(a.stdout, fi)
			}
			return nil
		}),
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "replace an existing TO")
	return cmd
}

func (a *app) mkdirCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mkdir SANDBOX:PATH...",
		Short: "Make folders (and their parents) in a sandbox",
		Long: `Make a folder in a sandbox's workspace, with its missing parents; a folder that exists is
fine (as mkdir -p).`,
		Example:           `  sandboxctl mkdir $SANDBOX_ID:src/pkg/util $SANDBOX_ID:out`,
		Args:              minArgs(1),
		ValidArgsFunction: a.completeRemote(0),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			targets, err := remoteArgs(cmd, args)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			for _, r := range targets {
				fi, created, err := c.MakeDir(cmd.Context(), r.sandbox, r.path)
				if err != nil {
					return err
				}
				if a.json() {
					writeLine(a.stdout, struct {
						client.FileInfo
						Created bool `json:"created"`
					}{fi, created})
				}
			}
			return nil
		}),
	}
	return cmd
}

func (a *app) statCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "stat SANDBOX:PATH",
		Short: "Describe a file, folder or link in a sandbox",
		Long: `Describe a path of a sandbox's workspace without following a link at its end: its type,
size, permissions, modification time, and a link's target.`,
		Example:           `  sandboxctl stat $SANDBOX_ID:out/report.json --output json`,
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeRemote(1),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			r, err := remoteArg(cmd, args[0])
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			fi, err := c.Stat(cmd.Context(), r.sandbox, r.path)
			if err != nil {
				return err
			}
			if a.json() {
				writeJSON(a.stdout, fi)
				return nil
			}
			typ := fi.Type
			if typ == "" {
				typ = pick(fi.IsDir, "DIRECTORY", pick(fi.Symlink != "", "SYMLINK", "FILE"))
			}
			fields(a.stdout,
				"path", printable(fi.Path),
				"type", printable(typ),
				"size", strconv.FormatInt(fi.Size, 10)+" ("+size(fi.Size)+")",
				"mode", printable(fi.Mode),
				"modified", when(fi.ModTime),
				"symlink", printable(fi.Symlink),
			)
			return nil
		}),
	}
	return cmd
}

func (a *app) watchCmd() *cobra.Command {
	var (
		opts client.WatchOptions
	)
	cmd := &cobra.Command{
		Use:   "watch SANDBOX:PATH",
		Short: "Print file events (created, modified, deleted, moved) under a sandbox folder",
		Long: `Watch a folder of a sandbox's workspace (with -r, its whole tree) and print one line per
event: time, CURSOR, CREATED, MODIFIED, DELETED or MOVED, and the path (MOVED: from -> to), a
trailing / on folders. OVERFLOW means events were lost (the watch's queue overflowed): rescan.
A dropped connection resumes after the last cursor, nothing lost or repeated.

Ctrl-C stops and prints the command that resumes after the last event (--after CURSOR, as long
as the sandbox keeps the watch). Names are quoted when they hold control characters.`,
		Example: `  sandboxctl watch $SANDBOX_ID:src -r
  sandboxctl watch $SANDBOX_ID: --output json
  sandboxctl watch $SANDBOX_ID:src -r --after 42`,
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeRemote(1),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			r, err := remoteArg(cmd, args[0])
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			w, err := c.WatchFiles(ctx, r.sandbox, r.path, opts)
			if err != nil {
				return err
			}
			defer w.Close()
			for {
				ev, err := w.Next()
				if err != nil {
					return a.watchEnded(ctx, err, args[0], opts.Recursive, w.Cursor())
				}
				a.printFileEvent(ev)
			}
		}),
	}
	f := cmd.Flags()
	f.BoolVarP(&opts.Recursive, "recursive", "r", false, "watch the whole tree below the folder")
	f.StringVar(&opts.After, "after", "", "resume after this cursor")
	return cmd
}

// fileEventJSON is a file event as watch prints it with --output json.
type fileEventJSON struct {
	Event  string `json:"event"` // created, modified, deleted, moved, overflow; stopped (Ctrl-C)
	Cursor string `json:"cursor,omitempty"`
	Path   string `json:"path,omitempty"`
	From   string `json:"from,omitempty"`
	IsDir  bool   `json:"is_dir,omitempty"`
	At     string `json:"at,omitempty"`
	Missed int64  `json:"missed,omitempty"`
	Reason string `json:"reason,omitempty"`
}

func (a *app) printFileEvent(ev client.FileEvent) {
	if a.json() {
		writeLine(a.stdout, fileEventJSON{Event: strings.ToLower(ev.Kind), Cursor: ev.Cursor, Path: ev.Path, From: ev.From, IsDir: ev.IsDir,
			At: when(ev.At), Missed: ev.Missed, Reason: ev.Reason})
		return
	}
	name := func(p string) string {
		if ev.IsDir {
			p += "/"
		}
		return printable(p)
	}
	at := orDash(when(ev.At))
	switch ev.Kind {
	case client.FileMoved:
		fmt.Fprintf(a.stdout, "%s  %s  %-8s  %s -> %s\n", at, printable(ev.Cursor), ev.Kind, name(ev.From), name(ev.Path))
	case client.FileOverflow:
		missed := "an unknown number of"
		if ev.Missed > 0 {
			missed = strconv.FormatInt(ev.Missed, 10)
		}
		fmt.Fprintf(a.stdout, "%s  %s  %-8s  %s events lost (%s); rescan\n", at, printable(ev.Cursor), ev.Kind, missed, printable(ev.Reason))
	default:
		fmt.Fprintf(a.stdout, "%s  %s  %-8s  %s\n", at, printable(ev.Cursor), printable(ev.Kind), name(ev.Path))
	}
}

// watchEnded ends a watch: Ctrl-C prints how to resume (130), the server's end is its error.
func (a *app) watchEnded(ctx context.Context, err error, arg string, recursive bool, cursor string) error {
	hint := "sandboxctl watch " + arg
	if recursive {
		hint += " -r"
	}
	if cursor != "" {
		hint += " --after " + cursor
	}
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, io.EOF)) {
		if a.json() {
			writeLine(a.stdout, fileEventJSON{Event: "stopped", Cursor: cursor})
		} else {
			fmt.Fprintf(a.stderr, "sandboxctl: stopped; resume: %s\n", printable(hint))
		}
		return &exitStatus{exitInterrupted}
	}
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err // the server ended the watch (its folder went away, the sandbox stopped, …)
}
