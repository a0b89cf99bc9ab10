// Command graphql-ws follows sandbox status events over a GraphQL WebSocket
// (graphql-transport-ws), the way a dashboard does:
//
//	go run ./examples/graphql-ws -url ws://127.0.0.1:8780/graphql [-sandbox sbx_…] [-after CURSOR]
//
// It reads the API key from SANDBOX_API_KEY, sends it in the connection_init payload, prints
// each event as a JSON line, and exits when the server completes the subscription (a one-sandbox
// subscription completes after DESTROYED) or on ^C. The public client (sandboxd/client) speaks
// the protocol and, when the connection drops, subscribes again after the last cursor.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"sandboxd/client"
)

func main() {
	url := flag.String("url", "ws://127.0.0.1:8780/graphql", "the GraphQL WebSocket endpoint")
	sandbox := flag.String("sandbox", "", "only this sandbox's events (default: the whole project)")
	after := flag.String("after", "", "resume after this cursor")
	flag.Parse()
	if err := run(*url, *sandbox, *after, os.Getenv("SANDBOX_API_KEY")); err != nil {
		fmt.Fprintln(os.Stderr, "graphql-ws:", err)
		os.Exit(1)
	}
}

func run(url, sandbox, after, key string) error {
	if key == "" {
		return fmt.Errorf("set SANDBOX_API_KEY")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	base := strings.TrimSuffix(strings.TrimRight(url, "/"), client.GraphQLPath)
	if rest, ok := strings.CutPrefix(base, "ws"); ok {
		base = "http" + rest
	}
	c, err := client.New(client.WithBaseURL(base), client.WithAPIKey(key))
	if err != nil {
		return err
	}
	vars := map[string]any{}
	if sandbox != "" {
		vars["sandboxId"] = sandbox
	}
	if after != "" {
		vars["after"] = after
	}
	sub, err := c.Subscribe(ctx, client.SandboxEventsQuery, vars)
	if err != nil {
		return err
	}
	defer sub.Close()
	for {
		ev, err := sub.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		fmt.Printf("{\"data\":{\"sandboxEvents\":%s}}\n", ev)
	}
}
