package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	sdk "sandboxd/client"
)

// restPrefix is the root of the REST paths.
const restPrefix = "/sandbox/sandboxes/v1"

// client speaks sandboxd's REST and GraphQL APIs with one API key. The sandbox verbs (create,
// stop, start, destroy) go through the public client (sdk); what a benchmark times per
// request (exec with a body made once, GraphQL POST and WebSocket exec on one kept connection,
// plain GETs) stays raw here, so that the timing holds the request and nothing else.
type client struct {
	base string
	key  string
	http *http.Client
	sdk  *sdk.Client
}

func newClient(base, key string) *client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 16
	c := &client{base: strings.TrimRight(base, "/"), key: key, http: &http.Client{Transport: tr, Timeout: 15 * time.Minute}}
	var err error
	if c.sdk, err = sdk.New(sdk.WithBaseURL(c.base), sdk.WithAPIKey(key), sdk.WithHTTPClient(c.http)); err != nil {
		panic(err) // the base URL and key come from the bench's own server or flags
	}
	return c
}

// withConns returns a client of the same server and key that keeps up to n idle keep-alive
// connections (for n concurrent callers).
func (c *client) withConns(n int) *client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = n
	tr.MaxIdleConns = max(n, tr.MaxIdleConns)
	return &client{base: c.base, key: c.key, http: &http.Client{Transport: tr, Timeout: time.Minute}, sdk: c.sdk}
}

// apiError is a non-2xx answer.
type apiError struct {
	Status     int
	Body       string
	RetryAfter time.Duration
}

func (e *apiError) Error() string {
	body := e.Body
	if len(body) > 500 {
		body = body[:500] + "…"
	}
	return fmt.Sprintf("HTTP %d: %s", e.Status, strings.TrimSpace(body))
}

// do sends one request with a JSON body (nil: none) and decodes a 2xx JSON answer into out.
func (c *client) do(ctx context.Context, method, path string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("X-Api-Key", c.key)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		e := &apiError{Status: resp.StatusCode, Body: string(data)}
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
			e.RetryAfter = time.Duration(s) * time.Second
		}
		return fmt.Errorf("%s %s: %w", method, path, e)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decoding %q: %w", method, path, data, err)
		}
	}
	return nil
}

type sandboxJSON struct {
	ID               string `json:"sandbox_id"`
	State            string `json:"state"`
	StateReason      string `json:"state_reason"`
	LatestSnapshotID string `json:"latest_snapshot_id"`
}

// execResult is the part of an exec result (REST or GraphQL) the benchmark checks.
type execResult struct {
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	TimedOut bool   `json:"timed_out"`
	Error    string `json:"error"`
	// DurationMs is the command's run time as the guest init measured it (start to exit).
	DurationMs int64 `json:"duration_ms"`
}

// check fails unless the command exited 0 with the wanted stdout ("" wants any).
func (r execResult) check(wantStdout string) error {
	if r.ExitCode != 0 || r.Signal != "" || r.TimedOut || r.Error != "" {
		return fmt.Errorf("exit %d, signal %q, timed out %v, error %q, stderr %q", r.ExitCode, r.Signal, r.TimedOut, r.Error, r.Stderr)
	}
	if wantStdout != "" && r.Stdout != wantStdout {
		return fmt.Errorf("got stdout %q, want %q", r.Stdout, wantStdout)
	}
	return nil
}

// benchProfile is the profile every sandbox of the benchmark is created with.
const benchProfile = "sandboxes-default"

// create creates a sandbox of benchProfile, its workspace restored from snapshot snapID
// (source.snapshot_id) unless snapID is "", and wants it RUNNING.
func (c *client) create(ctx context.Context, snapID string) (sandboxJSON, error) {
	return c.createOf(ctx, benchProfile, snapID)
}

// benchEgressProfile is benchProfile with network egress (an allow list of the benchmark
// range 198.18.0.0/15, which nothing answers: the rows time the network's setup only).
const benchEgressProfile = "bench-egress"

// createOf creates a sandbox of a profile.
func (c *client) createOf(ctx context.Context, profile, snapID string) (sandboxJSON, error) {
	req := sdk.CreateRequest{Profile: profile}
	if snapID != "" {
		req.Source = &sdk.Source{SnapshotID: snapID}
	}
	got, err := c.sdk.Create(ctx, req)
	sb := sandboxOf(got)
	if err == nil && sb.State != "RUNNING" {
		err = fmt.Errorf("created sandbox %s is %s (%s), want RUNNING", sb.ID, sb.State, sb.StateReason)
	}
	return sb, err
}

func sandboxOf(sb sdk.Sandbox) sandboxJSON {
	return sandboxJSON{ID: sb.ID, State: sb.State, StateReason: sb.StateReason, LatestSnapshotID: sb.LatestSnapshotID}
}

// execBody is the JSON body of a REST exec, made once per command.
func execBody(argv []string, stdin string) []byte {
	body := map[string]any{"command": argv, "timeout_sec": 600}
	if stdin != "" {
		body["stdin"] = stdin
	}
	b, _ := json.Marshal(body)
	return b
}

func (c *client) exec(ctx context.Context, id string, body []byte) (execResult, error) {
	var res execResult
	err := c.do(ctx, http.MethodPost, restPrefix+"/"+url.PathEscape(id)+"/exec", body, &res)
	return res, err
}

// lifecycle posts stop or start and wants the sandbox in state want.
func (c *client) lifecycle(ctx context.Context, id, verb, want string) (sandboxJSON, error) {
	var got sdk.Sandbox
	var err error
	switch verb {
	case "stop":
		got, err = c.sdk.Stop(ctx, id)
	case "start":
		got, err = c.sdk.Start(ctx, id)
	case "pause":
		got, err = c.sdk.Pause(ctx, id)
	case "resume":
		got, err = c.sdk.Resume(ctx, id)
	default:
		return sandboxJSON{}, fmt.Errorf("unknown verb %q", verb)
	}
	sb := sandboxOf(got)
	if err == nil && sb.State != want {
		err = fmt.Errorf("%s %s: got state %s (%s), want %s", verb, id, sb.State, sb.StateReason, want)
	}
	return sb, err
}

// destroy deletes a sandbox, retrying while a transition is in flight; a sandbox that is
// already gone counts as destroyed.
func (c *client) destroy(ctx context.Context, id string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, err := c.sdk.Destroy(ctx, id)
		var ae *sdk.Error
		switch {
		case err == nil:
			return nil
		case errors.As(err, &ae) && ae.Status == http.StatusNotFound:
			return nil
		case errors.As(err, &ae) && (ae.Status == http.StatusConflict || ae.Status == http.StatusServiceUnavailable) && time.Now().Before(deadline):
			wait := max(ae.RetryAfter, 500*time.Millisecond)
			select {
			case <-ctx.Done():
				return err
			case <-time.After(wait):
			}
		default:
			return err
		}
	}
}

// ---- GraphQL ----

// gqlExecMutation is the exec mutation of both GraphQL transports.
const gqlExecMutation = `mutation($id: ID!, $cmd: [String!]!) {
  exec(sandboxId: $id, input: {command: $cmd, timeoutSec: 600}) { exec { exitCode signal stdout stderr timedOut error } }
}`

type gqlExecData struct {
	Payload *struct {
		Exec *struct {
			ExitCode int     `json:"exitCode"`
			Signal   *string `json:"signal"`
			Stdout   string  `json:"stdout"`
			Stderr   string  `json:"stderr"`
			TimedOut bool    `json:"timedOut"`
			Error    *string `json:"error"`
		} `json:"exec"`
	} `json:"exec"`
}

type gqlAnswer struct {
	Data   json.RawMessage `json:"data"`
	Errors []struct {
		Message string `json:"message"`
	} `json:"errors"`
}

// execResultOf decodes a GraphQL exec answer.
func execResultOf(payload []byte) (execResult, error) {
	var a gqlAnswer
	if err := json.Unmarshal(payload, &a); err != nil {
		return execResult{}, fmt.Errorf("decoding GraphQL answer %q: %w", payload, err)
	}
	if len(a.Errors) > 0 {
		return execResult{}, fmt.Errorf("GraphQL error: %s", a.Errors[0].Message)
	}
	var d gqlExecData
	if err := json.Unmarshal(a.Data, &d); err != nil || d.Payload == nil || d.Payload.Exec == nil {
		return execResult{}, fmt.Errorf("GraphQL answer %q has no exec result (%v)", payload, err)
	}
	ex := d.Payload.Exec
	r := execResult{ExitCode: ex.ExitCode, Stdout: ex.Stdout, Stderr: ex.Stderr, TimedOut: ex.TimedOut}
	if ex.Signal != nil {
		r.Signal = *ex.Signal
	}
	if ex.Error != nil {
		r.Error = *ex.Error
	}
	return r, nil
}

// gqlExecRequest is the body of a GraphQL exec (POST) or the payload of a subscribe (WebSocket).
func gqlExecRequest(id string, argv []string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"query": gqlExecMutation, "variables": map[string]any{"id": id, "cmd": argv}})
	return b
}

// gqlExec posts the exec mutation to /graphql.
func (c *client) gqlExec(ctx context.Context, body []byte) (execResult, error) {
	var a json.RawMessage
	if err := c.do(ctx, http.MethodPost, "/graphql", body, &a); err != nil {
		return execResult{}, err
	}
	return execResultOf(a)
}

// wsConn is one graphql-transport-ws connection, kept open across operations.
type wsConn struct {
	c    *websocket.Conn
	next int
	// data is the buffer execOutputEvent decodes a chunk's dataBase64 into, reused: an event's
	// data is good until the next event (streamRun.output keeps a copy of the head only).
	data []byte
}

type wsMsg struct {
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// dialWS opens /graphql as graphql-transport-ws and authenticates in connection_init.
func (c *client) dialWS(ctx context.Context) (*wsConn, error) {
	u := "ws" + strings.TrimPrefix(c.base, "http") + "/graphql"
	conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}})
	if err != nil {
		return nil, fmt.Errorf("dialing %s: %w", u, err)
	}
	conn.SetReadLimit(64 << 20)
	w := &wsConn{c: conn}
	payload, _ := json.Marshal(map[string]string{"X-Api-Key": c.key})
	if err := w.write(ctx, wsMsg{Type: "connection_init", Payload: payload}); err != nil {
		conn.CloseNow()
		return nil, err
	}
	m, err := w.read(ctx)
	if err != nil {
		conn.CloseNow()
		return nil, err
	}
	if m.Type != "connection_ack" {
		conn.CloseNow()
		return nil, fmt.Errorf("websocket: got %s %s, want connection_ack", m.Type, m.Payload)
	}
	return w, nil
}

func (w *wsConn) write(ctx context.Context, m wsMsg) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return w.c.Write(ctx, websocket.MessageText, b)
}

// read returns the next message that is not a ping or pong, answering pings.
func (w *wsConn) read(ctx context.Context) (wsMsg, error) {
	for {
		_, b, err := w.c.Read(ctx)
		if err != nil {
			return wsMsg{}, fmt.Errorf("websocket read: %w", err)
		}
		var m wsMsg
		if err := json.Unmarshal(b, &m); err != nil {
			return wsMsg{}, fmt.Errorf("websocket: decoding %q: %w", b, err)
		}
		switch m.Type {
		case "ping":
			if err := w.write(ctx, wsMsg{Type: "pong"}); err != nil {
				return wsMsg{}, err
			}
		case "pong":
		default:
			return m, nil
		}
	}
}

// subscribe sends an operation as a subscribe message and returns its id.
func (w *wsConn) subscribe(ctx context.Context, payload json.RawMessage) (string, error) {
	w.next++
	id := strconv.Itoa(w.next)
	return id, w.write(ctx, wsMsg{ID: id, Type: "subscribe", Payload: payload})
}

// answer waits for the operation's next (its result); an error message fails.
func (w *wsConn) answer(ctx context.Context, id string) (json.RawMessage, error) {
	for {
		m, err := w.read(ctx)
		if err != nil {
			return nil, err
		}
		if m.ID != id {
			continue // the complete of an earlier operation
		}
		switch m.Type {
		case "next":
			return m.Payload, nil
		case "error":
			return nil, fmt.Errorf("websocket operation %s: error %s", id, m.Payload)
		case "complete":
			return nil, fmt.Errorf("websocket operation %s: complete without a result", id)
		}
	}
}

// complete waits for the operation's complete message.
func (w *wsConn) complete(ctx context.Context, id string) error {
	for {
		m, err := w.read(ctx)
		if err != nil {
			return err
		}
		if m.ID == id && (m.Type == "complete" || m.Type == "error") {
			return nil
		}
	}
}

func (w *wsConn) close() {
	if err := w.c.Close(websocket.StatusNormalClosure, "done"); err != nil {
		w.c.CloseNow()
	}
}
