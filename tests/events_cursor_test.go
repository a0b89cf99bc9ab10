package tests

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"sandboxd/tests/e2e"
)

// TestEventsCursorIsGapless: a dashboard loads its page of sandboxes with the page's
// eventsCursor, a change happens before it subscribes, and sandboxEvents after that cursor
// delivers the change. Another tenant's page neither lists the sandbox nor resolves its id as
// a node, and its own cursor's stream does not carry the change.
func TestEventsCursorIsGapless(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	id := s.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant1).SandboxID

	const page = `{ sandboxes(first: 50) { eventsCursor nodes { id state } } }`
	var got struct {
		EventsCursor string
		Nodes        []struct{ ID, State string }
	}
	s.GQL(t, page, nil, e2e.HdrTenant1).OK(t, "sandboxes", &got)
	if got.EventsCursor == "" || len(got.Nodes) != 1 || got.Nodes[0].ID != id || got.Nodes[0].State != "RUNNING" {
		t.Fatalf("got %+v, want the running sandbox and a cursor", got)
	}
	var other struct {
		EventsCursor string
		Nodes        []struct{ ID string }
	}
	s.GQL(t, page, nil, e2e.HdrTenant2).OK(t, "sandboxes", &other)
	if len(other.Nodes) != 0 {
		t.Errorf("tenant 2 lists %+v, want none of tenant 1's sandboxes", other.Nodes)
	}
	s.GQL(t, `query($id: ID!) { node(id: $id) { id } }`, map[string]any{"id": id}, e2e.HdrTenant2).WantCode(t, http.StatusOK, "NOT_FOUND")

	// The change between the page and the subscription.
	s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/stop", nil, e2e.HdrTenant1).Want(t, http.StatusOK)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	subscribe := func(key, after string) func() eventJSON {
		c := dialGraphQL(ctx, t, s)
		send(ctx, t, c, wsMsg{Type: "connection_init", Payload: rawJSON(t, map[string]any{"X-Api-Key": key})})
		if m := nextMsg(ctx, t, c); m.Type != "connection_ack" {
			t.Fatalf("got %s %s, want connection_ack", m.Type, m.Payload)
		}
		send(ctx, t, c, wsMsg{ID: "1", Type: "subscribe", Payload: rawJSON(t, map[string]any{
			"query": gqlEventsSub, "variables": map[string]any{"after": after}})})
		return func() eventJSON {
			t.Helper()
			m := nextMsg(ctx, t, c)
			var ev gqlEvent
			if m.Type != "next" || json.Unmarshal(m.Payload, &ev) != nil || len(ev.Errors) > 0 || ev.Data.SandboxEvents == nil {
				t.Fatalf("got %s %s, want an event", m.Type, m.Payload)
			}
			return *ev.Data.SandboxEvents
		}
	}
	checkStop(t, subscribe(e2e.KeyTenant1, got.EventsCursor), id)

	// Tenant 2's stream after its cursor: a change of its own arrives, tenant 1's stop never.
	id2 := s.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant2).SandboxID
	next2 := subscribe(e2e.KeyTenant2, other.EventsCursor)
	for {
		ev := next2()
		if ev.SandboxID != id2 {
			t.Fatalf("tenant 2 got event %s of %s, want only its own sandbox's", ev, ev.SandboxID)
		}
		if ev.State == "RUNNING" {
			break
		}
	}
}
