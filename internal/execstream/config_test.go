package execstream

import (
	"strings"
	"testing"
	"time"
)

func TestConfig(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	o := c.Options()
	if o.MaxLen != 50000 || o.MaxBytes != 16<<20 || o.Retention != time.Hour || o.MaxEndedBytes != 64<<20 || c.FollowLease() != 10*time.Second {
		t.Errorf("default options: %+v, follow lease %v", o, c.FollowLease())
	}
	for _, tt := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"entries", func(c *Config) { c.StreamMaxEntries = 99 }, "stream_max_entries"},
		{"bytes", func(c *Config) { c.StreamMaxBytes = 2 << 30 }, "stream_max_bytes"},
		{"retention", func(c *Config) { c.RetentionSec = 0 }, "retention_sec"},
		{"lease", func(c *Config) { c.FollowLeaseSec = 601 }, "follow_lease_sec"},
		{"ended", func(c *Config) { c.MaxEndedBytes = c.StreamMaxBytes - 1 }, "max_ended_bytes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.edit(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}
