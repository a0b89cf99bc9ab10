package execs

import (
	"testing"

	"sandboxd/internal/apierror"
	"sandboxd/internal/execstream"
	"sandboxd/internal/sandbox"
)

// TestBeginStart: at most MaxRunningExecs starts wait on one sandbox's answer; while one of its
// starts went unanswered the next fails at once, until its follower reports an answer; other
// sandboxes are not affected, and an end called twice counts once.
func TestBeginStart(t *testing.T) {
	s := &Service{cfg: sandbox.Config{MaxRunningExecs: 2}, starting: map[string]int{}, stuck: map[string]string{}}
	end1, err := s.beginStart("sbx_a")
	if err != nil {
		t.Fatal(err)
	}
	end2, err := s.beginStart("sbx_a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.beginStart("sbx_a"); apierror.CodeOf(err) != apierror.LimitExceeded {
		t.Fatalf("a third start waiting on the sandbox: got %v, want %s", err, apierror.LimitExceeded)
	}
	endB, err := s.beginStart("sbx_b")
	if err != nil {
		t.Fatalf("another sandbox's start: %v", err)
	}
	end1()
	end1()
	end3, err := s.beginStart("sbx_a")
	if err != nil {
		t.Fatalf("a start after one ended: %v", err)
	}
	if _, err := s.beginStart("sbx_a"); apierror.CodeOf(err) != apierror.LimitExceeded {
		t.Fatalf("an end called twice counted twice: got %v, want %s", err, apierror.LimitExceeded)
	}
	end2()
	end3()
	endB()
	if len(s.starting) != 0 {
		t.Fatalf("got starts %v left, want none", s.starting)
	}

	// A start went unanswered: the next fails at once, naming it, until its follower reports.
	s.stuck["sbx_a"] = "exec_1"
	_, err = s.beginStart("sbx_a")
	if e := apierror.From(err); e.Code != apierror.Unavailable || e.RetryAfter == 0 {
		t.Fatalf("a start on a stuck sandbox: got %v, want %s with a Retry-After", err, apierror.Unavailable)
	}
	if _, err := s.beginStart("sbx_b"); err != nil {
		t.Fatalf("another sandbox's start: %v", err)
	}
	other := &follower{s: s, meta: execstream.Meta{ID: "exec_2", Sandbox: "sbx_a"}, unanswered: true}
	other.answered()
	if s.stuck["sbx_a"] != "exec_1" {
		t.Fatalf("another exec's answer cleared the mark: %v", s.stuck)
	}
	f := &follower{s: s, meta: execstream.Meta{ID: "exec_1", Sandbox: "sbx_a"}, unanswered: true}
	f.answered()
	if _, err := s.beginStart("sbx_a"); err != nil {
		t.Fatalf("a start after the sandbox answered: %v", err)
	}
}
