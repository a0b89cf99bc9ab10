package sandbox

import "time"

// Time-based rules as pure functions of a clock passed in (house rule 7).

// AutostopAt is when a running sandbox stops by itself if nothing happens before: the last
// activity plus autostop_sec. Zero when the sandbox never auto-stops.
func AutostopAt(lastActivity time.Time, autostopSec int64) time.Time {
	if autostopSec <= 0 || lastActivity.IsZero() {
		return time.Time{}
	}
	return lastActivity.Add(time.Duration(autostopSec) * time.Second)
}

// ExpiresAt is when a sandbox's TTL ends: created plus ttl_sec. Zero when it has no TTL.
func ExpiresAt(created time.Time, ttlSec int64) time.Time {
	if ttlSec <= 0 {
		return time.Time{}
	}
	return created.Add(time.Duration(ttlSec) * time.Second)
}

// Due is what time says must happen to a sandbox now.
type Due int

const (
	// DueNothing: leave it alone.
	DueNothing Due = iota
	// DueAutostop: a running sandbox has been idle for autostop_sec: stop it.
	DueAutostop
	// DueExpire: the sandbox's TTL has ended: destroy it (checkpointed first).
	DueExpire
)

// Clock facts about one sandbox, as the reconciler sees them.
type ClockFacts struct {
	State        State
	CreatedAt    time.Time
	TTLSec       int64
	AutostopSec  int64
	LastActivity time.Time
	// Busy is true while an exec or agent run is still running in the sandbox: a long build
	// is never stopped under a user.
	Busy bool
}

// DueAt decides what is due at now. Expiry wins over auto-stop; only RUNNING sandboxes
// auto-stop; any sandbox that still exists expires (a stopped one too).
func DueAt(f ClockFacts, now time.Time) Due {
	switch f.State {
	case Destroying, Destroyed, Expired:
		return DueNothing
	}
	if t := ExpiresAt(f.CreatedAt, f.TTLSec); !t.IsZero() && !now.Before(t) {
		return DueExpire
	}
	if f.State != Running || f.Busy {
		return DueNothing
	}
	if t := AutostopAt(f.LastActivity, f.AutostopSec); !t.IsZero() && !now.Before(t) {
		return DueAutostop
	}
	return DueNothing
}
