package ratelimit

import (
	"strings"
	"testing"
	"time"

	"sandboxd/internal/auth"
	"sandboxd/internal/redistest"
)

func TestConfigFor(t *testing.T) {
	cfg := Config{
		RequestsPerSec: 10, Burst: 20,
		Keys: map[string]Limit{"alice": {RequestsPerSec: 100, Burst: 200}, "platform": {}},
		Tenants: map[string]Limit{
			"acme": {RequestsPerSec: 50, Burst: 50},
			"ops":  {RequestsPerSec: 1, Burst: 1},
			"big":  {RequestsPerSec: 500, Burst: 500},
		},
	}
	tests := []struct {
		name string
		cfg  Config
		p    auth.Principal
		want Limit
	}{
		{"key-over-tenant", cfg, alice, Limit{100, 200}},
		{"tenant-over-default", cfg, bob, Limit{50, 50}},
		{"default", cfg, carol, Limit{10, 20}},
		{"key-override-unlimited-over-tenant", cfg, platform, Limit{}},
		{"key-override-follows-the-key-not-the-scope", cfg, actingFor(alice, "other", "x"), Limit{100, 200}},
		{"tenant-override-follows-the-scope-acted-for", cfg, actingFor(bob, "big", "x"), Limit{500, 500}},
		{"zero-config-unlimited", Config{}, alice, Limit{}},
		{"tenant-only", Config{Tenants: map[string]Limit{"acme": {1, 2}}}, bob, Limit{1, 2}},
		{"tenant-only-other-tenant-unlimited", Config{Tenants: map[string]Limit{"acme": {1, 2}}}, carol, Limit{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.cfg.For(tt.p); got != tt.want {
				t.Fatalf("For(%+v): got %v, want %v", tt.p, got, tt.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string // substrings of the error, one per problem; none means valid
	}{
		{"zero", Config{}, nil},
		{"default", Config{RequestsPerSec: 10, Burst: 20}, nil},
		{"burst-below-rate", Config{RequestsPerSec: 10, Burst: 1}, nil},
		{"bounds", Config{RequestsPerSec: MaxRequestsPerSec, Burst: MaxBurst}, nil},
		{"override-unlimited", Config{RequestsPerSec: 1, Burst: 1, Keys: map[string]Limit{"ci": {}}}, nil},
		{"overrides", Config{Keys: map[string]Limit{"ci bot": {5, 5}}, Tenants: map[string]Limit{"acme": {1, 1}}}, nil},
		{"negative-rate", Config{RequestsPerSec: -1, Burst: 1}, []string{"rate_limit: requests_per_sec and burst must not be negative, got -1 and 1"}},
		{"negative-burst", Config{RequestsPerSec: 1, Burst: -1}, []string{"rate_limit: requests_per_sec and burst must not be negative, got 1 and -1"}},
		{"no-burst", Config{RequestsPerSec: 5}, []string{"rate_limit: burst must be at least 1 when requests_per_sec is set"}},
		{"burst-without-rate", Config{Burst: 5}, []string{"rate_limit: burst 5 without requests_per_sec"}},
		{"rate-too-high", Config{RequestsPerSec: MaxRequestsPerSec + 1, Burst: 1}, []string{"rate_limit: requests_per_sec must be at most 10000, got 10001"}},
		{"burst-too-high", Config{RequestsPerSec: 1, Burst: MaxBurst + 1}, []string{"rate_limit: burst must be at most 100000, got 100001"}},
		{"bad-key-override", Config{Keys: map[string]Limit{"ci": {RequestsPerSec: 3}}}, []string{`rate_limit.keys["ci"]: burst must be at least 1`}},
		{"empty-key-name", Config{Keys: map[string]Limit{" ": {1, 1}}}, []string{`rate_limit.keys: " " is not a key name`}},
		{"bad-tenant-override", Config{Tenants: map[string]Limit{"acme": {-2, 0}}}, []string{`rate_limit.tenants["acme"]: requests_per_sec and burst must not be negative`}},
		{"bad-tenant-id", Config{Tenants: map[string]Limit{"acme:web": {1, 1}}}, []string{`rate_limit.tenants: "acme:web" is not a valid tenant id`}},
		{"every-problem", Config{RequestsPerSec: -1, Keys: map[string]Limit{"b": {0, 1}, "a": {1, 0}}, Tenants: map[string]Limit{"": {1, 1}}}, []string{
			"rate_limit: requests_per_sec and burst must not be negative",
			`rate_limit.keys["a"]: burst must be at least 1`,
			`rate_limit.keys["b"]: burst 1 without requests_per_sec`,
			`rate_limit.tenants: "" is not a valid tenant id`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("got %v, want valid", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("got valid, want %q", tt.want)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.want) {
				t.Fatalf("got %d problems %q, want %d", len(lines), lines, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.Contains(lines[i], w) {
					t.Fatalf("problem %d: got %q, want it to contain %q", i, lines[i], w)
				}
			}
		})
	}
}

func TestCheckKeyNames(t *testing.T) {
	cfg := Config{Keys: map[string]Limit{"ci": {1, 1}, "cli": {1, 1}, "SANDBOX_API_KEY": {}}}
	if err := cfg.CheckKeyNames([]string{"SANDBOX_API_KEY", "ci", "cli", "other"}); err != nil {
		t.Fatalf("all known: got %v, want nil", err)
	}
	err := cfg.CheckKeyNames([]string{"ci", "deploy"})
	want := `rate_limit.keys: no API key is named "SANDBOX_API_KEY", "cli" (the keys are ["ci" "deploy"])`
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
}

func TestNew(t *testing.T) {
	srv := redistest.Embedded(t)
	if _, err := New(nil, Config{}, Options{}); err == nil {
		t.Fatal("nil client: got nil error, want one")
	}
	if _, err := New(srv.Client, Config{RequestsPerSec: 1}, Options{}); err == nil || !strings.Contains(err.Error(), "burst must be at least 1") {
		t.Fatalf("invalid config: got %v, want the validation error", err)
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want int
	}{
		{-time.Second, 1},
		{0, 1},
		{time.Nanosecond, 1},
		{999 * time.Millisecond, 1},
		{time.Second, 1},
		{time.Second + time.Nanosecond, 2},
		{1500 * time.Millisecond, 2},
		{2 * time.Second, 2},
		{time.Minute + time.Millisecond, 61},
	}
	for _, tt := range tests {
		t.Run(tt.d.String(), func(t *testing.T) {
			if got := RetryAfterSeconds(tt.d); got != tt.want {
				t.Fatalf("RetryAfterSeconds(%v): got %d, want %d", tt.d, got, tt.want)
			}
		})
	}
}
