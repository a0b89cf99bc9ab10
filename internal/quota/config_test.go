package quota

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
	if o.Limits.Default != 10 || o.Lease != 60*time.Second || o.RetryAfter != 5*time.Second {
		t.Errorf("default options: %+v", o)
	}
	c.Limits = map[string]int{"acme:evals": 3}
	if got := c.Options().Limits.For("acme", "evals"); got != 3 {
		t.Errorf("per-scope limit: got %d, want 3", got)
	}
	for _, tt := range []struct {
		name string
		c    Config
		want []string
	}{
		{"negative-default", Config{DefaultLimit: -1, LeaseSec: 1, RetryAfterSec: 1}, []string{"default_limit"}},
		{"no-lease", Config{RetryAfterSec: 1}, []string{"lease_sec"}},
		{"scope", Config{LeaseSec: 1, RetryAfterSec: 1, Limits: map[string]int{"acme": 1, "a:b": -1}},
			[]string{`quota.limits: "acme" must be tenant:project`, `quota.limits: "a:b"`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.c.Validate()
			for _, w := range tt.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("got %v, want an error mentioning %q", err, w)
				}
			}
		})
	}
}
