package client_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"sandboxd/client"
	"sandboxd/internal/api/apitest"
)

// TestLabels: create with labels, list with a label filter and update as a merge patch,
// against the real REST handler: what the service gets and what the client reads back.
func TestLabels(t *testing.T) {
	e := newEnv(t)
	c := e.client(t)
	ctx := context.Background()
	labels := map[string]string{"team": "ml", "example.com/tier": "gold"}
	sb, err := c.Create(ctx, client.CreateRequest{Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(sb.Labels, labels) || !maps.Equal(e.fake.Last("Create").Create.Labels, labels) {
		t.Fatalf("create: got %v, the service %v, want %v", sb.Labels, e.fake.Last("Create").Create.Labels, labels)
	}
	if _, err := c.List(ctx, client.ListOptions{Labels: labels, Limit: 5}); err != nil {
		t.Fatal(err)
	}
	if got := e.fake.Last("List").List.Labels; !maps.Equal(got, labels) {
		t.Fatalf("list: the service got the filter %v, want %v", got, labels)
	}

	up, err := c.Update(ctx, apitest.SandboxRunning, client.UpdateRequest{SetLabels: map[string]string{"team": "web"},
		RemoveLabels: []string{"old"}, AutostopSec: client.Ptr[int64](60), TTLSec: client.Ptr[int64](7200)})
	if err != nil {
		t.Fatal(err)
	}
	got := e.fake.Last("Update").Update
	if v, ok := got.Labels["old"]; !ok || v != nil || *got.Labels["team"] != "web" || *got.AutostopSec != 60 || *got.TTLSec != 7200 || got.ClearLabels {
		t.Fatalf("update: the service got %+v", got)
	}
	if up.Labels["team"] != "web" || up.AutostopSec != 60 || up.ExpiresAt == nil || !up.ExpiresAt.Equal(apitest.T0.Add(2*time.Hour)) {
		t.Fatalf("update: got %+v, want the new labels, autostop and expiry", up)
	}
	if _, err := c.Update(ctx, apitest.SandboxRunning, client.UpdateRequest{ClearLabels: true}); err != nil {
		t.Fatal(err)
	}
	if got := e.fake.Last("Update").Update; !got.ClearLabels || len(got.Labels) != 0 {
		t.Fatalf("clear: the service got %+v", got)
	}
	calls := len(e.fake.CallsTo("Update"))
	if _, err := c.Update(ctx, apitest.SandboxRunning, client.UpdateRequest{ClearLabels: true, SetLabels: map[string]string{"a": "b"}}); err == nil {
		t.Fatal("clear and set in one update: got no error")
	}
	if n := len(e.fake.CallsTo("Update")); n != calls {
		t.Fatalf("a refused update reached the server")
	}
	if _, err := c.Update(ctx, "sbx_other", client.UpdateRequest{TTLSec: client.Ptr[int64](100)}); !client.IsCode(err, client.CodeNotFound) {
		t.Fatalf("another tenant's sandbox: got %v, want NOT_FOUND", err)
	}
}
