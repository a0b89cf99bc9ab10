package gvisor

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"sandboxd/internal/netpolicy"
)

// netLeft lists what of box id's network exists: its box file, namespace file, host-side
// veth, nftables chain and dispatch rule.
func netLeft(t *testing.T, n *netState, id string) []string {
	t.Helper()
	var left []string
	for name, path := range map[string]string{"box file": n.boxFile(id), "namespace": n.nsPath(id)} {
		if _, err := os.Lstat(path); err == nil {
			left = append(left, name)
		}
	}
	slots, _ := os.ReadDir(n.slotDir())
	for _, e := range slots {
		if owner, err := os.ReadFile(filepath.Join(n.slotDir(), e.Name())); err == nil && string(owner) == n.dir+" "+id {
			left = append(left, "slot "+e.Name())
		}
	}
	if _, err := netlink.LinkByName(n.iface(id)); err == nil {
		left = append(left, "veth")
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListTableOfFamily(n.table.Name, n.table.Family); err != nil {
		return left // no table: no chain, no rule
	}
	chains, err := c.ListChainsOfTableFamily(n.table.Family)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(chains, func(ch *nftables.Chain) bool {
		return ch.Table.Name == n.table.Name && ch.Name == boxChainName(boxTag(id))
	}) {
		left = append(left, "chain")
	}
	rules, _ := c.GetRules(n.table, &nftables.Chain{Name: chainBoxes, Table: n.table})
	if slices.ContainsFunc(rules, func(r *nftables.Rule) bool { return string(r.UserData) == id }) {
		left = append(left, "dispatch rule")
	}
	return left
}

// TestNetReconcile: at a driver's start, the network of a box that is not running and was made
// before the setup grace is removed whole (what a server killed during a create or a destroy
// leaves), and so is a namespace whose box file is gone; a running box's network and one made
// moments ago (another server's create on the same state folder) are kept.
func TestNetReconcile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("networks need root")
	}
	n, err := newNetState(t.TempDir(), "10.251.0.0/26", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	p := netpolicy.Effective(netpolicy.Spec{Mode: netpolicy.ModeEgress, Allow: []string{"198.18.0.0/24"}},
		netpolicy.DefaultAlwaysDeny, []string{"198.18.0.2"}, nil)
	ids := []string{"sbx_reconcile_stale", "sbx_reconcile_nsonly", "sbx_reconcile_fresh", "sbx_reconcile_running"}
	t.Cleanup(func() {
		for _, id := range ids {
			_ = n.down(id)
		}
		n.removeTableIfIdle()
	})
	for _, id := range ids {
		if _, err := n.up(id, p); err != nil {
			t.Fatal(err)
		}
		if left := netLeft(t, n, id); len(left) != 6 {
			t.Fatalf("%s after up: %v, want its box file, namespace, slot, veth, chain and rule", id, left)
		}
	}
	old := time.Now().Add(-setupGrace - time.Minute)
	for _, id := range []string{"sbx_reconcile_stale", "sbx_reconcile_running"} {
		if err := os.Chtimes(n.boxFile(id), old, old); err != nil {
			t.Fatal(err)
		}
	}
	// A namespace and a slot whose box file is gone (a kill between the slot and the box file
	// leaves the slot alone): the slot is old, as a create killed long ago left it.
	if err := os.Remove(n.boxFile("sbx_reconcile_nsonly")); err != nil {
		t.Fatal(err)
	}
	slots, _ := os.ReadDir(n.slotDir())
	for _, e := range slots {
		if err := os.Chtimes(filepath.Join(n.slotDir(), e.Name()), old, old); err != nil {
			t.Fatal(err)
		}
	}
	n.reconcile(context.Background(), func(_ context.Context, id string) bool { return id == "sbx_reconcile_running" })
	for _, id := range []string{"sbx_reconcile_stale", "sbx_reconcile_nsonly"} {
		if left := netLeft(t, n, id); len(left) > 0 {
			t.Errorf("%s: left after reconcile: %v", id, left)
		}
	}
	for _, id := range []string{"sbx_reconcile_fresh", "sbx_reconcile_running"} {
		if left := netLeft(t, n, id); len(left) != 6 {
			t.Errorf("%s: reconcile removed part of a kept network: %v left", id, left)
		}
	}
}
