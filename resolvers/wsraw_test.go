package resolvers

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/sandbox"
)

// TestLargeDataOverWebsocket: responses whose data skips gqlgen's second encoding on a
// WebSocket (wsraw.go) arrive exactly as over SSE, which encodes them the plain way: large
// chunks (text with quotes, backslashes, <, >, & and invalid UTF-8, and binary; within the SSE
// reader's line bound) and small ones, in order, and nothing of a token ever reaches the client.
func TestLargeDataOverWebsocket(t *testing.T) {
	big := func(n int, seed byte) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7) + seed
		}
		return b
	}
	text := []byte(strings.Repeat(`a "quoted" <tag> & back\slash é `, 200) + "\xe2\x82")
	events := []sandbox.ExecEvent{
		{Kind: sandbox.ExecChunk, Cursor: "10-0", Stream: "stdout", Data: text},
		{Kind: sandbox.ExecChunk, Cursor: "20-0", Stream: "stdout", Data: []byte("small\n")},
		{Kind: sandbox.ExecChunk, Cursor: "30-0", Stream: "stderr", Data: big(20<<10, 3)},
		{Kind: sandbox.ExecChunk, Cursor: "40-0", Stream: "stdout", Data: big(100, 9)},
		{Kind: sandbox.ExecChunk, Cursor: "50-0", Stream: "stdout", Data: big(30<<10, 1)},
		{Kind: sandbox.ExecExit, Cursor: "50-1", Result: new(apitest.EndedExec())},
	}
	e := newEnv(t, HandlerOptions{})
	e.fake.ExecEvents[apitest.ExecEnded] = events
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	c := wsSubscribe(ctx, t, e, execOutputQuery, map[string]any{"id": apitest.ExecEnded})
	c.SetReadLimit(8 << 20)
	var ws []json.RawMessage
	for {
		m := next(ctx, t, c)
		if m.Type == "complete" {
			break
		}
		if m.Type != "next" || m.ID != "1" {
			t.Fatalf("got %s for %q: %s, want next for 1", m.Type, m.ID, m.Payload)
		}
		if bytes.Contains(m.Payload, []byte("sbx-raw-")) {
			t.Fatalf("a token reached the client: %.200s", m.Payload)
		}
		ws = append(ws, m.Payload)
	}
	checkExecDrained(ctx, t, e, len(events))

	_, sc := postSSEVars(t, e, apitest.UserKey, execOutputQuery, map[string]any{"id": apitest.ExecEnded})
	sse := readSSE(t, sc)
	if len(ws) != len(events) || len(sse) != len(events) {
		t.Fatalf("got %d events over the WebSocket and %d over SSE, want %d", len(ws), len(sse), len(events))
	}
	for i, ev := range events {
		w, s := execOutputOf(t, ws[i]), execOutputOf(t, sse[i])
		if g, want := mustJSON(w), mustJSON(s); !bytes.Equal(g, want) {
			t.Errorf("event %d: the WebSocket's %.300s differs from SSE's %.300s", i, g, want)
		}
		if ev.Kind != sandbox.ExecChunk {
			continue
		}
		if w.DataBase64 == nil {
			t.Fatalf("event %d: no dataBase64", i)
		}
		got, err := base64.StdEncoding.DecodeString(*w.DataBase64)
		if err != nil || !bytes.Equal(got, ev.Data) {
			t.Errorf("event %d: got %d bytes (%v), want the chunk's %d", i, len(got), err, len(ev.Data))
		}
	}
}

// TestRawDataSplice: a token is replaced by its data once, tokens of one connection are
// unknown to another, a message without a token (or with a forged one) is left as it is, and a
// connection holds at most maxStashed.
func TestRawDataSplice(t *testing.T) {
	d, other := newRawData(), newRawData()
	tok, ok := d.put(json.RawMessage(`{"x":"<&>"}`))
	if !ok {
		t.Fatal("put refused")
	}
	msg := []byte(`{"id":"1","type":"next","payload":{"data":` + string(tok) + `}}`)
	if got := string(d.splice(msg)); got != `{"id":"1","type":"next","payload":{"data":{"x":"<&>"}}}` {
		t.Errorf("splice: %s", got)
	}
	if got := d.splice(msg); !bytes.Equal(got, msg) {
		t.Errorf("a token spliced twice: %s", got)
	}
	tok2, _ := d.put(json.RawMessage(`1`))
	forged := []byte(`{"data":` + string(tok2[:len(tok2)-2]) + `9"}`)
	if got := other.splice(append([]byte(nil), forged...)); !bytes.Equal(got, forged) {
		t.Errorf("another connection spliced: %s", got)
	}
	if got := d.splice(append([]byte(nil), forged...)); !bytes.Equal(got, forged) {
		t.Errorf("a forged token spliced: %s", got)
	}
	for i := len(d.m); i < maxStashed; i++ {
		if _, ok := d.put(json.RawMessage(fmt.Sprint(i))); !ok {
			t.Fatalf("put %d refused below the bound", i)
		}
	}
	if _, ok := d.put(json.RawMessage(`0`)); ok {
		t.Errorf("put accepted past maxStashed (%d)", maxStashed)
	}
}
