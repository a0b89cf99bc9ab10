package sandbox

import (
	"testing"
	"time"
)

func TestTries(t *testing.T) {
	tr := tries{retry: time.Minute}
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	if !tr.begin("a", now) {
		t.Fatal("a first try did not begin")
	}
	if tr.begin("a", now) {
		t.Fatal("a second try of a began while the first runs")
	}
	if !tr.begin("b", now) || tr.count() != 2 {
		t.Fatalf("b beside a: count %d, want 2", tr.count())
	}
	tr.fail("a", now)
	tr.end("a")
	if tr.begin("a", now.Add(59*time.Second)) {
		t.Fatal("a began again within retry of its failure")
	}
	if !tr.begin("a", now.Add(time.Minute)) {
		t.Fatal("a did not begin once retry had passed")
	}
	tr.end("a")
	tr.fail("a", now)
	tr.forget("a")
	if !tr.begin("a", now) {
		t.Fatal("a forgotten failure still held a back")
	}
	tr.end("a")
	tr.end("b")
	if tr.count() != 0 {
		t.Fatalf("count %d after every try ended", tr.count())
	}
}
