package runtime_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"sandboxd/runtime"
)

func TestJobs(t *testing.T) {
	var j runtime.Jobs
	ctx := context.Background()
	if j.Pending("a") {
		t.Fatal("a pending before any job")
	}
	if err := j.Wait(ctx, "a"); err != nil {
		t.Fatalf("Wait with no job: %v", err)
	}

	// A key's jobs run one after the other, in the order started; another key's beside them.
	release := make(chan struct{})
	var mu sync.Mutex
	var order []string
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	j.Start("a", func() { <-release; note("a1") })
	j.Start("a", func() { note("a2") })
	bDone := make(chan struct{})
	j.Start("b", func() { note("b"); close(bDone) })
	select {
	case <-bDone:
	case <-time.After(10 * time.Second):
		t.Fatal("b's job waited for a's")
	}
	if !j.Pending("a") {
		t.Fatal("a not pending while its first job blocks")
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := j.Wait(short, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on a blocked job: %v, want the context's error", err)
	}
	close(release)
	if err := j.Wait(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := append([]string(nil), order...)
	mu.Unlock()
	if len(got) != 3 || got[0] != "b" || got[1] != "a1" || got[2] != "a2" {
		t.Fatalf("order %v, want b, a1, a2 (Wait returns after the key's latest job)", got)
	}
	if j.Pending("a") || j.Pending("b") {
		t.Fatal("a job still pending after it ended")
	}

	ran := make(chan struct{})
	j.Start("c", func() { time.Sleep(20 * time.Millisecond); close(ran) })
	j.WaitAll()
	select {
	case <-ran:
	default:
		t.Fatal("WaitAll returned before the job ended")
	}
}
