// Command exec-stream runs a command in a sandbox and streams its output live over a GraphQL
// WebSocket (graphql-transport-ws), reconnecting and resuming from the last cursor when the
// connection drops, so no byte is lost or printed twice:
//
//	go run ./examples/exec-stream -sandbox sbx_… -- bash -lc 'for i in $(seq 5); do echo $i; sleep 1; done'
//	go run ./examples/exec-stream -exec exec_…   # reattach to a command started earlier
//
// It reads the API key from SANDBOX_API_KEY, starts the command with exec(wait: false), follows
// execOutput, writes the command's stdout and stderr byte for byte to its own, and exits with
// the command's exit code (1 plus a message when the command could not be followed to its end).
// Any replica of the server can serve any reconnect. The resuming is the public client's
// (sandboxd/client): SubscribeExecOutput redials and subscribes again after the last cursor.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"sandboxd/client"
)

const execMutation = `mutation($sandbox: ID!, $command: [String!]!) {
  exec(sandboxId: $sandbox, input: {command: $command}, wait: false) { exec { execId state } } }`

func main() {
	url := flag.String("url", "ws://127.0.0.1:8780/graphql", "the GraphQL WebSocket endpoint")
	sandbox := flag.String("sandbox", "", "the sandbox to run the command in")
	execID := flag.String("exec", "", "follow this exec instead of starting a command")
	after := flag.String("after", "", "with -exec: resume after this cursor")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	code, err := run(ctx, *url, os.Getenv("SANDBOX_API_KEY"), *sandbox, *execID, *after, flag.Args())
	if err != nil {
		fmt.Fprintln(os.Stderr, "exec-stream:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

// baseURL turns the WebSocket endpoint into the gateway's base URL.
func baseURL(ws string) string {
	u := strings.TrimSuffix(strings.TrimRight(ws, "/"), client.GraphQLPath)
	if rest, ok := strings.CutPrefix(u, "ws"); ok {
		return "http" + rest // ws → http, wss → https
	}
	return u
}

func run(ctx context.Context, url, key, sandbox, execID, after string, argv []string) (int, error) {
	switch {
	case key == "":
		return 0, errors.New("set SANDBOX_API_KEY")
	case execID == "" && (sandbox == "" || len(argv) == 0):
		return 0, errors.New("give -sandbox and a command after --, or -exec")
	}
	c, err := client.New(client.WithBaseURL(baseURL(url)), client.WithAPIKey(key))
	if err != nil {
		return 0, err
	}
	if execID == "" {
		var out struct {
			Exec struct {
				Exec struct {
					ExecID string `json:"execId"`
				} `json:"exec"`
			} `json:"exec"`
		}
		if _, err := c.Do(ctx, execMutation, map[string]any{"sandbox": sandbox, "command": argv}, &out); err != nil {
			return 0, err
		}
		execID = out.Exec.Exec.ExecID
		fmt.Fprintln(os.Stderr, "exec-stream: started", execID)
	}
	sub, err := c.SubscribeExecOutput(ctx, execID, after)
	if err != nil {
		return 0, err
	}
	defer sub.Close()
	for {
		ev, err := sub.Next()
		if err == io.EOF {
			return 0, fmt.Errorf("%s: the stream ended without an exit event", execID)
		}
		if err != nil {
			return 0, fmt.Errorf("after cursor %q: %w", sub.Cursor(), err)
		}
		switch ev.Kind {
		case "CHUNK":
			w := os.Stdout
			if ev.Stream == "STDERR" {
				w = os.Stderr
			}
			if _, err := w.Write(ev.Data); err != nil {
				return 0, err
			}
		case "TRUNCATED":
			fmt.Fprintf(os.Stderr, "exec-stream: %d bytes of output are no longer kept\n", ev.MissedBytes)
		case "EXIT":
			return exitCode(execID, ev.Result)
		}
	}
}

func exitCode(execID string, r *client.ExecSummary) (int, error) {
	switch {
	case r == nil:
		return 0, fmt.Errorf("%s: an exit event without a result", execID)
	case r.Error != nil:
		return 0, fmt.Errorf("%s: %s", execID, *r.Error)
	case r.TimedOut:
		return 0, fmt.Errorf("%s timed out", execID)
	case r.ExitCode == nil:
		return 0, fmt.Errorf("%s ended without an exit code", execID)
	}
	return *r.ExitCode, nil
}
