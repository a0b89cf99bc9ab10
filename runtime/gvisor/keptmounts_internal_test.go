package gvisor

import (
	"slices"
	"testing"
)

// The kept disks' bookkeeping: the oldest go beyond the bound, a start (forget) or another
// stop (keep) of an evicted box before its unmount cancels the unmount, and a bound of 0
// evicts the box itself.
func TestKeptMountsBookkeeping(t *testing.T) {
	k := keptMounts{max: 2}
	if ev := k.keep("a"); ev != nil {
		t.Fatalf("keep a: evicted %v", ev)
	}
	k.keep("b")
	if ev := k.keep("a"); ev != nil { // stopped again: the newest, nothing over the bound
		t.Fatalf("keep a again: evicted %v", ev)
	}
	if ev := k.keep("c"); !slices.Equal(ev, []string{"b"}) {
		t.Fatalf("keep c: evicted %v, want [b]", ev)
	}
	if !k.has("b") {
		t.Fatal("b is still mounted until its unmount: has(b) = false")
	}
	// b started before its unmount ran: the unmount is skipped.
	if !k.forget("b") || k.claimEviction("b") {
		t.Fatal("a started box must not be unmounted")
	}
	if ev := k.keep("d"); !slices.Equal(ev, []string{"a"}) {
		t.Fatalf("keep d: evicted %v, want [a]", ev)
	}
	// a stopped again before its unmount ran: kept as the newest, c goes instead.
	if ev := k.keep("a"); !slices.Equal(ev, []string{"c"}) {
		t.Fatalf("keep a after its eviction: evicted %v, want [c]", ev)
	}
	if k.claimEviction("a") {
		t.Fatal("a box kept again must not be unmounted")
	}
	if !k.claimEviction("c") || k.claimEviction("c") {
		t.Fatal("c must be unmounted once")
	}
	if k.has("c") || k.forget("c") {
		t.Fatal("c is unmounted: not kept")
	}
	if !slices.Equal(k.ids, []string{"d", "a"}) {
		t.Fatalf("kept: %v, want [d a]", k.ids)
	}

	none := keptMounts{}
	if ev := none.keep("x"); !slices.Equal(ev, []string{"x"}) {
		t.Fatalf("a bound of 0: evicted %v, want [x]", ev)
	}
}
