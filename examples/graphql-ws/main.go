// Command graphql-ws follows sandbox status events over a GraphQL WebSocket
// (graphql-transport-ws), the way a dashboard does:
//
//	go run ./examples/graphql-ws -url ws://127.0.0.1:8780/graphql [-sandbox sbx_…] [-after CURSOR]
//
// It reads the API key from SANDBOX_API_KEY, sends it in the connection_init payload, prints
// each event as a JSON line, and exits when the server completes the subscription (a one-sandbox
// subscription completes after DESTROYED) or on ^C.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
)

type message struct {
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

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
	conn, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}})
	if err != nil {
		return err
	}
	defer conn.CloseNow()

	initPayload, _ := json.Marshal(map[string]string{"X-Api-Key": key})
	if err := wsjson.Write(ctx, conn, message{Type: "connection_init", Payload: initPayload}); err != nil {
		return err
	}
	vars := map[string]any{}
	if sandbox != "" {
		vars["sandboxId"] = sandbox
	}
	if after != "" {
		vars["after"] = after
	}
	sub, _ := json.Marshal(map[string]any{
		"query":     "subscription($sandboxId: ID, $after: String) { sandboxEvents(sandboxId: $sandboxId, after: $after) { cursor type sandboxId state previousState reason at } }",
		"variables": vars,
	})
	for {
		var m message
		if err := wsjson.Read(ctx, conn, &m); err != nil {
			if websocket.CloseStatus(err) == 4403 {
				return fmt.Errorf("the server refused the API key: %w", err)
			}
			return err
		}
		switch m.Type {
		case "connection_ack":
			if err := wsjson.Write(ctx, conn, message{ID: "1", Type: "subscribe", Payload: sub}); err != nil {
				return err
			}
		case "ping":
			if err := wsjson.Write(ctx, conn, message{Type: "pong"}); err != nil {
				return err
			}
		case "next":
			fmt.Println(string(m.Payload))
		case "error":
			return fmt.Errorf("subscription error: %s", m.Payload)
		case "complete":
			return conn.Close(websocket.StatusNormalClosure, "")
		}
	}
}
