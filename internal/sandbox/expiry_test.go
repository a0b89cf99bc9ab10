package sandbox

import (
	"testing"
	"time"
)

func TestDueAt(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	base := ClockFacts{State: Running, CreatedAt: t0, TTLSec: 3600, AutostopSec: 60, LastActivity: t0}
	with := func(f func(*ClockFacts)) ClockFacts { c := base; f(&c); return c }
	tests := []struct {
		name  string
		facts ClockFacts
		now   time.Time
		want  Due
	}{
		{"fresh", base, t0, DueNothing},
		{"idle-just-before", base, t0.Add(59 * time.Second), DueNothing},
		{"idle-exactly", base, t0.Add(60 * time.Second), DueAutostop},
		{"idle-but-busy", with(func(c *ClockFacts) { c.Busy = true }), t0.Add(10 * time.Minute), DueNothing},
		{"recent-activity", with(func(c *ClockFacts) { c.LastActivity = t0.Add(5 * time.Minute) }), t0.Add(5*time.Minute + 59*time.Second), DueNothing},
		{"no-autostop", with(func(c *ClockFacts) { c.AutostopSec = 0 }), t0.Add(50 * time.Minute), DueNothing},
		{"ttl-ends", base, t0.Add(time.Hour), DueExpire},
		{"ttl-beats-busy", with(func(c *ClockFacts) { c.Busy = true }), t0.Add(time.Hour), DueExpire},
		{"stopped-expires", with(func(c *ClockFacts) { c.State = Stopped }), t0.Add(2 * time.Hour), DueExpire},
		{"stopped-never-autostops", with(func(c *ClockFacts) { c.State = Stopped }), t0.Add(30 * time.Minute), DueNothing},
		{"failed-never-autostops", with(func(c *ClockFacts) { c.State = Failed }), t0.Add(30 * time.Minute), DueNothing},
		{"no-ttl", with(func(c *ClockFacts) { c.TTLSec = 0; c.Busy = true }), t0.Add(1000 * time.Hour), DueNothing},
		{"destroying-nothing", with(func(c *ClockFacts) { c.State = Destroying }), t0.Add(2 * time.Hour), DueNothing},
		{"no-activity-recorded", with(func(c *ClockFacts) { c.LastActivity = time.Time{} }), t0.Add(30 * time.Minute), DueNothing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DueAt(tt.facts, tt.now); got != tt.want {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestAutostopAndExpiresAt(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	if got := AutostopAt(t0, 1800); !got.Equal(t0.Add(30 * time.Minute)) {
		t.Errorf("AutostopAt: got %v, want %v", got, t0.Add(30*time.Minute))
	}
	if got := AutostopAt(t0, 0); !got.IsZero() {
		t.Errorf("AutostopAt without autostop: got %v, want zero", got)
	}
	if got := ExpiresAt(t0, 14400); !got.Equal(t0.Add(4 * time.Hour)) {
		t.Errorf("ExpiresAt: got %v, want %v", got, t0.Add(4*time.Hour))
	}
	if got := ExpiresAt(t0, 0); !got.IsZero() {
		t.Errorf("ExpiresAt without ttl: got %v, want zero", got)
	}
}
