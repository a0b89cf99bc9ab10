package agents

import (
	"slices"
	"testing"

	"sandboxd/internal/sandbox"
)

// TestPageRuns: pages by id, newest first, whatever order the store listed the runs in; a
// page that ends exactly at the last run has no next page; a cursor between ids (its run
// gone) goes on after its place.
func TestPageRuns(t *testing.T) {
	ids := []string{ // oldest first
		"run_01J00000000000000000000010", "run_01J00000000000000000000020", "run_01J00000000000000000000030",
		"run_01J00000000000000000000040", "run_01J00000000000000000000050",
	}
	runs := func() []sandbox.AgentRun {
		// A store's order (by score) need not be the ids' order.
		order := []int{3, 4, 1, 2, 0}
		out := make([]sandbox.AgentRun, len(order))
		for i, j := range order {
			out[i] = sandbox.AgentRun{ID: ids[j]}
		}
		return out
	}
	gone := "run_01J00000000000000000000035" // between ids[3] and ids[2]
	for _, tc := range []struct {
		name     string
		limit    int
		after    string
		want     []string
		wantNext string
	}{
		{"first-page", 2, "", []string{ids[4], ids[3]}, ids[3]},
		{"middle-page", 2, ids[3], []string{ids[2], ids[1]}, ids[1]},
		{"exact-fill-last", 1, ids[1], []string{ids[0]}, ""},
		{"all-exact-fill", 5, "", []string{ids[4], ids[3], ids[2], ids[1], ids[0]}, ""},
		{"after-the-oldest", 5, ids[0], nil, ""},
		{"after-a-gone-run", 2, gone, []string{ids[2], ids[1]}, ids[1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			page := pageRuns(runs(), tc.limit, tc.after)
			var got []string
			for _, r := range page.Runs {
				got = append(got, r.ID)
			}
			if !slices.Equal(got, tc.want) || page.NextCursor != tc.wantNext {
				t.Errorf("got %v next %q, want %v next %q", got, page.NextCursor, tc.want, tc.wantNext)
			}
		})
	}
}
