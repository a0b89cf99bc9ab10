package fairshare

import (
	"sync"
	"testing"
)

func TestCapPerScope(t *testing.T) {
	l := New(2)
	r1, ok1 := l.Acquire("a:p")
	_, ok2 := l.Acquire("a:p")
	if !ok1 || !ok2 {
		t.Fatal("the first two holds were refused")
	}
	if _, ok := l.Acquire("a:p"); ok {
		t.Fatal("a third hold of a:p was allowed")
	}
	if _, ok := l.Acquire("b:p"); !ok {
		t.Fatal("b:p was refused while a:p was at its cap")
	}
	r1()
	r1() // a second release gives nothing back twice
	if got := l.Held("a:p"); got != 1 {
		t.Fatalf("a:p holds %d after one release, want 1", got)
	}
	if _, ok := l.Acquire("a:p"); !ok {
		t.Fatal("a:p was refused after a release")
	}
	if _, ok := l.Acquire("a:p"); ok {
		t.Fatal("a:p went over its cap after a double release")
	}
}

func TestNoCap(t *testing.T) {
	l := New(0)
	for range 1000 {
		if _, ok := l.Acquire("a:p"); !ok {
			t.Fatal("refused without a cap")
		}
	}
}

func TestConcurrentNeverOvershoots(t *testing.T) {
	l := New(10)
	var wg sync.WaitGroup
	var mu sync.Mutex
	granted := 0
	for range 100 {
		wg.Go(func() {
			if _, ok := l.Acquire("a:p"); ok {
				mu.Lock()
				granted++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if granted != 10 || l.Held("a:p") != 10 {
		t.Fatalf("granted %d, held %d; want 10 and 10", granted, l.Held("a:p"))
	}
}
