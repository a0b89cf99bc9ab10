package execs

import (
	"fmt"
	"slices"
	"testing"
)

// TestReleaserGathersPerSandboxWithinItsBound: ended execs gather per sandbox in the order they
// ended, a take empties the releaser, and past maxReleasePending new ids are not gathered (their
// guests keep them within their own bounds) until a take makes room.
func TestReleaserGathersPerSandboxWithinItsBound(t *testing.T) {
	var r releaser
	r.add("sbx_a", "exec_1")
	r.add("sbx_b", "exec_2")
	r.add("sbx_a", "exec_3")
	got := r.take()
	if len(got) != 2 || !slices.Equal(got["sbx_a"], []string{"exec_1", "exec_3"}) || !slices.Equal(got["sbx_b"], []string{"exec_2"}) {
		t.Fatalf("take: %v", got)
	}
	if again := r.take(); len(again) != 0 {
		t.Fatalf("a second take: %v, want nothing", again)
	}
	for i := range maxReleasePending + 10 {
		r.add(fmt.Sprintf("sbx_%d", i%7), fmt.Sprintf("exec_%d", i))
	}
	n := 0
	for _, ids := range r.take() {
		n += len(ids)
	}
	if n != maxReleasePending {
		t.Fatalf("gathered %d ids, want the bound %d", n, maxReleasePending)
	}
	r.add("sbx_a", "exec_after")
	if got := r.take(); !slices.Equal(got["sbx_a"], []string{"exec_after"}) {
		t.Fatalf("after a take: %v", got)
	}
}
