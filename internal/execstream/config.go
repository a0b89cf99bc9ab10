package execstream

import (
	"errors"
	"time"
)

// Config is the exec output streams' part of the execs section of sandboxd's config.
type Config struct {
	// StreamMaxEntries and StreamMaxBytes bound one exec's output stream (entries, and log
	// bytes: output plus 5 bytes per chunk); older output is dropped and readers get a
	// truncated event.
	StreamMaxEntries int64 `json:"stream_max_entries"`
	StreamMaxBytes   int64 `json:"stream_max_bytes"`
	// RetentionSec is how long an ended exec's output and status stay readable.
	RetentionSec int `json:"retention_sec"`
	// MaxEndedBytes bounds the output all ended execs keep together; beyond it the oldest
	// ended execs are dropped before their retention ends.
	MaxEndedBytes int64 `json:"max_ended_bytes"`
	// FollowLeaseSec is the follower lease: how long the execs of a replica that died wait
	// before another replica follows them on.
	FollowLeaseSec int `json:"follow_lease_sec"`
}

// DefaultConfig is the section when config says nothing: the Options' defaults, and a 10 s
// follower lease.
func DefaultConfig() Config {
	return Config{StreamMaxEntries: 50000, StreamMaxBytes: 16 << 20, RetentionSec: 3600,
		MaxEndedBytes: 64 << 20, FollowLeaseSec: 10}
}

// Validate reports every problem of c, each naming its setting.
func (c Config) Validate() error {
	var errs []error
	if c.StreamMaxEntries < 100 || c.StreamMaxBytes < 64<<10 || c.StreamMaxBytes > 1<<30 {
		errs = append(errs, errors.New("execs: stream_max_entries must be at least 100 and stream_max_bytes between 65536 and 1 GiB"))
	}
	if c.RetentionSec < 1 || c.FollowLeaseSec < 3 || c.FollowLeaseSec > 600 {
		errs = append(errs, errors.New("execs: retention_sec must be at least 1 and follow_lease_sec between 3 and 600"))
	}
	if c.MaxEndedBytes < c.StreamMaxBytes {
		errs = append(errs, errors.New("execs: max_ended_bytes must be at least stream_max_bytes"))
	}
	return errors.Join(errs...)
}

// FollowLease is FollowLeaseSec as a duration: the follower lease the domain takes.
func (c Config) FollowLease() time.Duration { return time.Duration(c.FollowLeaseSec) * time.Second }

// Options are a Store's options from c (Blocking, the clock and the read tuning are the
// caller's).
func (c Config) Options() Options {
	return Options{MaxLen: c.StreamMaxEntries, MaxBytes: c.StreamMaxBytes,
		Retention: time.Duration(c.RetentionSec) * time.Second, MaxEndedBytes: c.MaxEndedBytes}
}
