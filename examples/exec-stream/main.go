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
// Any replica of the server can serve any reconnect.
package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
)

type message struct {
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

type outputEvent struct {
	Cursor      string  `json:"cursor"`
	Kind        string  `json:"kind"`
	Stream      string  `json:"stream"`
	DataBase64  string  `json:"dataBase64"`
	MissedBytes int64   `json:"missedBytes"`
	Result      *result `json:"result"`
}

type result struct {
	ExecID   string  `json:"execId"`
	State    string  `json:"state"`
	ExitCode *int    `json:"exitCode"`
	Signal   *string `json:"signal"`
	TimedOut bool    `json:"timedOut"`
	Error    *string `json:"error"`
}

const (
	execMutation = `mutation($sandbox: ID!, $command: [String!]!) {
  exec(sandboxId: $sandbox, input: {command: $command}, wait: false) { execId state } }`
	outputSubscription = `subscription($exec: ID!, $after: String) {
  execOutput(execId: $exec, after: $after) { cursor kind stream dataBase64 missedBytes
    result { execId state exitCode signal timedOut error } } }`
)

func main() {
	url := flag.String("url", "ws://127.0.0.1:8780/graphql", "the GraphQL WebSocket endpoint")
	sandbox := flag.String("sandbox", "", "the sandbox to run the command in")
	execID := flag.String("exec", "", "follow this exec instead of starting a command")
	after := flag.String("after", "", "with -exec: resume after this cursor")
	flag.Parse()
	key := os.Getenv("SANDBOX_API_KEY")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	code, err := run(ctx, *url, key, *sandbox, *execID, *after, flag.Args())
	if err != nil {
		fmt.Fprintln(os.Stderr, "exec-stream:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(ctx context.Context, url, key, sandbox, execID, after string, argv []string) (int, error) {
	switch {
	case key == "":
		return 0, errors.New("set SANDBOX_API_KEY")
	case execID == "" && (sandbox == "" || len(argv) == 0):
		return 0, errors.New("give -sandbox and a command after --, or -exec")
	}
	f := &follower{url: url, key: key, cursor: after, stdout: os.Stdout, stderr: os.Stderr}
	if execID == "" {
		var err error
		if execID, err = f.start(ctx, sandbox, argv); err != nil {
			return 0, err
		}
		fmt.Fprintln(os.Stderr, "exec-stream: started", execID)
	}
	for attempt := 0; ; attempt++ {
		res, err := f.follow(ctx, execID)
		if err == nil {
			return exitCode(res)
		}
		var fatal *fatalError
		if errors.As(err, &fatal) || ctx.Err() != nil || attempt >= 20 {
			return 0, err
		}
		// The connection dropped: resume after the last cursor, on whichever replica answers.
		wait := time.Duration(min(attempt+1, 10)) * 500 * time.Millisecond
		fmt.Fprintf(os.Stderr, "exec-stream: %v; resuming after %q in %s\n", err, f.cursor, wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

func exitCode(r *result) (int, error) {
	switch {
	case r.Error != nil:
		return 0, fmt.Errorf("%s: %s", r.ExecID, *r.Error)
	case r.TimedOut:
		return 0, fmt.Errorf("%s timed out", r.ExecID)
	case r.ExitCode == nil:
		return 0, fmt.Errorf("%s ended without an exit code", r.ExecID)
	}
	return *r.ExitCode, nil
}

// fatalError is an answer that a retry cannot change (a bad key, an unknown exec).
type fatalError struct{ msg string }

func (e *fatalError) Error() string { return e.msg }

type follower struct {
	url, key       string
	cursor         string
	stdout, stderr io.Writer
}

// dial opens a WebSocket and completes the graphql-transport-ws handshake.
func (f *follower) dial(ctx context.Context) (*websocket.Conn, error) {
	conn, _, err := websocket.Dial(ctx, f.url, &websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}})
	if err != nil {
		return nil, err
	}
	// An event carries up to 64 KiB of output, base64-encoded.
	conn.SetReadLimit(1 << 20)
	initPayload, _ := json.Marshal(map[string]string{"X-Api-Key": f.key})
	if err := wsjson.Write(ctx, conn, message{Type: "connection_init", Payload: initPayload}); err != nil {
		conn.CloseNow()
		return nil, err
	}
	for {
		m, err := f.read(ctx, conn)
		if err != nil {
			conn.CloseNow()
			return nil, err
		}
		if m.Type == "connection_ack" {
			return conn, nil
		}
	}
}

// read returns the next message that is not a keepalive.
func (f *follower) read(ctx context.Context, conn *websocket.Conn) (message, error) {
	for {
		var m message
		if err := wsjson.Read(ctx, conn, &m); err != nil {
			if websocket.CloseStatus(err) == 4403 {
				return m, &fatalError{"the server refused the API key"}
			}
			return m, err
		}
		switch m.Type {
		case "ping":
			if err := wsjson.Write(ctx, conn, message{Type: "pong"}); err != nil {
				return m, err
			}
		case "pong":
		default:
			return m, nil
		}
	}
}

// operation sends one operation (a subscribe message; its answers follow as next messages).
func (f *follower) operation(ctx context.Context, conn *websocket.Conn, id, query string, vars map[string]any) error {
	payload, _ := json.Marshal(map[string]any{"query": query, "variables": vars})
	return wsjson.Write(ctx, conn, message{ID: id, Type: "subscribe", Payload: payload})
}

type answer struct {
	Data   json.RawMessage `json:"data"`
	Errors []struct {
		Message    string `json:"message"`
		Extensions struct {
			Code string `json:"code"`
		} `json:"extensions"`
	} `json:"errors"`
}

func decode(m message, into any) error {
	if m.Type == "error" {
		return &fatalError{fmt.Sprintf("the server refused the operation: %s", m.Payload)}
	}
	var a answer
	if err := json.Unmarshal(m.Payload, &a); err != nil {
		return err
	}
	if len(a.Errors) > 0 {
		e := a.Errors[0]
		if e.Extensions.Code == "UNAVAILABLE" {
			return errors.New(e.Message)
		}
		return &fatalError{fmt.Sprintf("%s: %s", e.Extensions.Code, e.Message)}
	}
	return json.Unmarshal(a.Data, into)
}

// start runs the command with wait: false and returns its exec id.
func (f *follower) start(ctx context.Context, sandbox string, argv []string) (string, error) {
	conn, err := f.dial(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Close(websocket.StatusNormalClosure, "")
	if err := f.operation(ctx, conn, "exec", execMutation, map[string]any{"sandbox": sandbox, "command": argv}); err != nil {
		return "", err
	}
	m, err := f.read(ctx, conn)
	if err != nil {
		return "", err
	}
	var data struct {
		Exec struct {
			ExecID string `json:"execId"`
		} `json:"exec"`
	}
	if err := decode(m, &data); err != nil {
		return "", err
	}
	return data.Exec.ExecID, nil
}

// follow subscribes to the output after f.cursor and copies it out until the exit event; an
// error means the stream broke (retry) or cannot go on (fatalError).
func (f *follower) follow(ctx context.Context, execID string) (*result, error) {
	conn, err := f.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.CloseNow()
	vars := map[string]any{"exec": execID}
	if f.cursor != "" {
		vars["after"] = f.cursor
	}
	if err := f.operation(ctx, conn, "out", outputSubscription, vars); err != nil {
		return nil, err
	}
	for {
		m, err := f.read(ctx, conn)
		if err != nil {
			return nil, err
		}
		if m.Type == "complete" {
			return nil, errors.New("the output stream ended before the exit event")
		}
		var data struct {
			ExecOutput outputEvent `json:"execOutput"`
		}
		if err := decode(m, &data); err != nil {
			return nil, err
		}
		ev := data.ExecOutput
		switch ev.Kind {
		case "CHUNK":
			b, err := base64.StdEncoding.DecodeString(ev.DataBase64)
			if err != nil {
				return nil, &fatalError{fmt.Sprintf("undecodable chunk at %s: %v", ev.Cursor, err)}
			}
			w := f.stdout
			if ev.Stream == "STDERR" {
				w = f.stderr
			}
			if _, err := w.Write(b); err != nil {
				return nil, &fatalError{err.Error()}
			}
		case "TRUNCATED":
			fmt.Fprintf(os.Stderr, "exec-stream: %d bytes of output were dropped by the bounded stream before %s\n", ev.MissedBytes, ev.Cursor)
		case "EXIT":
			conn.Close(websocket.StatusNormalClosure, "")
			return ev.Result, nil
		}
		f.cursor = ev.Cursor
	}
}
