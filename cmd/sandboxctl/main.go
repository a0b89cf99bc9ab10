// Command sandboxctl is the command line of sandboxd: sandboxes, commands with live output,
// files in and out, snapshots and agent runs, on the public Go client (sandboxd/client).
//
// It reads SANDBOX_GATEWAY_URL and SANDBOX_API_KEY (flags --url and --api-key override them),
// prints text or, with --output json, JSON, and exits with a code that tells what happened
// (see exitHelp).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"sandboxd/client"
)

// Exit codes of sandboxctl itself. exec and logs --follow exit with the command's own code.
const (
	exitOK          = 0
	exitUsage       = 64  // a bad command line (EX_USAGE)
	exitServer      = 69  // the server answered an error, or could not be reached (EX_UNAVAILABLE)
	exitLocal       = 74  // a local file could not be read or written, or cp refused an entry (EX_IOERR)
	exitInterrupted = 130 // interrupted (Ctrl-C, SIGTERM) or detached (terminal's detach key); says how to go on
)

const exitHelp = `Exit codes:
  0     success
  64    usage error: unknown command or flag, wrong arguments, no API key
  69    the server answered an error (its code and message are printed) or could not be reached
  74    a local file could not be read or written, or cp refused an entry
  130   interrupted (Ctrl-C) or detached: exec and terminal detach, the command runs on, and
        sandboxctl prints how to follow or reattach; watch stops and prints how to resume
  exec, logs --follow and terminal exit with the command's own exit code, 128+N when signal N
  killed it.`

// Environment variables besides the client's SANDBOX_GATEWAY_URL and SANDBOX_API_KEY.
const (
	envTenant  = "SANDBOX_TENANT_ID"
	envProject = "SANDBOX_PROJECT_ID"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C ends sandboxctl at once
	}()
	os.Exit(run(ctx, os.Args[1:], &app{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}))
}

// app is one run of sandboxctl: its streams, environment and global flags.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	// httpClient, when set, carries every request (tests).
	httpClient *http.Client

	url, apiKey, tenant, project, output string

	c *client.Client
	// ran is set once a command's RunE started: errors before it are usage errors.
	ran bool
	// cmdPath is the command that failed ("sandboxctl exec"), for the usage hint.
	cmdPath string
}

// run runs one command line and answers the exit code.
func run(ctx context.Context, args []string, a *app) int {
	root := a.rootCmd()
	root.SetArgs(args)
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	a.cmdPath = cmd.CommandPath()
	return a.fail(ctx, err)
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "sandboxctl",
		Short: "Drive sandboxd: sandboxes, commands, files, snapshots and agent runs",
		Long: `sandboxctl drives a sandboxd gateway through its public API.

The gateway and key come from SANDBOX_GATEWAY_URL and SANDBOX_API_KEY (--url and --api-key
override them; prefer the variable for the key: a flag shows in the process list). A platform
key acts for another tenant:project with --tenant and --project (SANDBOX_TENANT_ID,
SANDBOX_PROJECT_ID).

Every command prints text, or JSON with --output json. Errors print the server's code and
message.

` + exitHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			switch a.output {
			case "text", "json":
				return nil
			}
			return usagef("--output must be text or json, got %q", a.output)
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.url, "url", "", "the gateway's base URL (default $"+client.EnvGatewayURL+", else "+client.DefaultBaseURL+")")
	pf.StringVar(&a.apiKey, "api-key", "", "the API key (default $"+client.EnvAPIKey+")")
	pf.StringVar(&a.tenant, "tenant", "", "act for this tenant (a platform key; default $"+envTenant+")")
	pf.StringVar(&a.project, "project", "", "act for this project (a platform key; default $"+envProject+")")
	pf.StringVarP(&a.output, "output", "o", "text", "output format: text or json")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"text", "json"}, cobra.ShellCompDirectiveNoFileComp))
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err.Error()} })
	root.CompletionOptions.HiddenDefaultCmd = false

	root.AddGroup(&cobra.Group{ID: "sandboxes", Title: "Sandboxes:"}, &cobra.Group{ID: "work", Title: "Commands and files:"},
		&cobra.Group{ID: "more", Title: "Snapshots and agent runs:"})
	for _, c := range []*cobra.Command{a.createCmd(), a.listCmd(), a.getCmd(), a.stopCmd(), a.startCmd(), a.pauseCmd(), a.resumeCmd(), a.destroyCmd(), a.quotaCmd(), a.updateCmd()} {
		c.GroupID = "sandboxes"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{a.execCmd(), a.logsCmd(), a.execsCmd(), a.signalCmd(), a.terminalCmd(), a.cpCmd(),
		a.rmCmd(), a.mvCmd(), a.mkdirCmd(), a.statCmd(), a.watchCmd()} {
		c.GroupID = "work"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{a.snapshotCmd(), a.agentCmd()} {
		c.GroupID = "more"
		root.AddCommand(c)
	}
	return root
}

// runE wraps a command's body: from here on, errors are no usage errors unless it says so.
func (a *app) runE(f func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a.ran = true
		return f(cmd, args)
	}
}

// client is the API client of the flags and environment, made on first use.
func (a *app) client() (*client.Client, error) {
	if a.c != nil {
		return a.c, nil
	}
	pick := func(flag, env string) string {
		if flag != "" {
			return flag
		}
		return a.getenv(env)
	}
	base := pick(a.url, client.EnvGatewayURL)
	if base == "" {
		base = client.DefaultBaseURL
	}
	key := pick(a.apiKey, client.EnvAPIKey)
	if key == "" {
		return nil, usagef("no API key: set %s (or pass --api-key)", client.EnvAPIKey)
	}
	opts := []client.Option{client.WithBaseURL(base), client.WithAPIKey(key)}
	tenant, project := pick(a.tenant, envTenant), pick(a.project, envProject)
	if tenant != "" || project != "" {
		if tenant == "" || project == "" {
			return nil, usagef("--tenant and --project go together (%s, %s)", envTenant, envProject)
		}
		opts = append(opts, client.WithScope(tenant, project))
	}
	if a.httpClient != nil {
		opts = append(opts, client.WithHTTPClient(a.httpClient))
	}
	c, err := client.New(opts...)
	if err != nil {
		return nil, &usageError{err.Error()}
	}
	a.c = c
	return c, nil
}

func (a *app) json() bool { return a.output == "json" }

// ---- errors and exit codes ----

// usageError is a bad command line.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// exitStatus ends sandboxctl with a code, having printed what there was to print.
type exitStatus struct{ code int }

func (e *exitStatus) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// fail prints err (text or JSON on stderr) and answers its exit code.
func (a *app) fail(ctx context.Context, err error) int {
	var st *exitStatus
	if errors.As(err, &st) {
		return st.code
	}
	code, kind := exitServer, ""
	var ue *usageError
	var ce *client.Error
	var cpe *client.CopyError
	var pe *fs.PathError
	var le *os.LinkError
	var ue2 *url.Error
	var ne net.Error
	var se *stdinError
	switch {
	case errors.As(err, &ue) || !a.ran:
		code, kind = exitUsage, "USAGE"
	case ctx.Err() != nil && errors.Is(err, context.Canceled):
		code, kind = exitInterrupted, "INTERRUPTED"
		err = errors.New("interrupted")
	case errors.As(err, &ce):
		return a.printServerError(ce)
	case errors.As(err, &ue2) || errors.As(err, &ne):
		kind = "UNREACHABLE"
	case errors.As(err, &cpe) || errors.As(err, &pe) || errors.As(err, &le) || errors.As(err, &se):
		code, kind = exitLocal, "LOCAL"
	}
	if a.json() {
		writeJSON(a.stderr, map[string]any{"error": map[string]any{"code": kind, "message": err.Error()}})
	} else {
		fmt.Fprintf(a.stderr, "sandboxctl: %s\n", err)
		if code == exitUsage {
			fmt.Fprintf(a.stderr, "Run '%s --help' for usage.\n", a.cmdPath)
		}
	}
	return code
}

// printServerError prints the server's error: code, message, details, Retry-After.
func (a *app) printServerError(e *client.Error) int {
	if a.json() {
		body := map[string]any{"code": e.Code, "message": e.Message, "status": e.Status}
		for k, v := range e.Details {
			body[k] = v
		}
		if e.RetryAfter > 0 {
			body["retry_after_sec"] = int64(e.RetryAfter.Seconds())
		}
		writeJSON(a.stderr, map[string]any{"error": body})
		return exitServer
	}
	code := e.Code
	if code == "" {
		code = fmt.Sprintf("HTTP %d", e.Status)
	}
	// The message may name what a sandbox chose (a file, a label): quoted when it holds
	// control characters, as every name sandboxctl prints outside a terminal session.
	fmt.Fprintf(a.stderr, "sandboxctl: %s: %s", printable(code), printable(e.Message))
	if e.RetryAfter > 0 {
		fmt.Fprintf(a.stderr, " (retry after %s)", e.RetryAfter)
	}
	fmt.Fprintln(a.stderr)
	return exitServer
}

// splitKV parses repeated K=V flags.
func splitKV(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usagef("--%s wants NAME=VALUE, got %q", flag, kv)
		}
		out[k] = v
	}
	return out, nil
}
