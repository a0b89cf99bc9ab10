package localredis

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Config is the redis section of sandboxd's config: the Redis it runs itself when REDIS_URL is
// unset.
type Config struct {
	// Embedded runs a supervised redis-server under the state folder. Unset means: yes when no
	// REDIS_URL is given. true with a REDIS_URL, or false without one, is a config error.
	Embedded *bool `json:"embedded"`
	// Binary is the redis-server to run (default: redis-server on PATH).
	Binary string `json:"binary"`
	// MaxMemory is Redis's maxmemory: bytes, or with a unit (256mb, 1gb). Writes beyond it fail
	// (noeviction) rather than evict exec output a client has not read.
	MaxMemory string `json:"maxmemory"`
	// AppendFsync is the AOF's fsync policy: everysec (default: at most one second of writes
	// lost on a power cut; none on a crash of sandboxd or redis-server) or always.
	AppendFsync string `json:"appendfsync"`
}

// DefaultConfig is the section's defaults. maxmemory is 1gb: ended execs alone may keep
// execs.max_ended_bytes (256 MiB by default) until their sweep, and a Redis that fills refuses
// every follower's write (noeviction), so the running execs' output needs room beside them.
func DefaultConfig() Config {
	return Config{Binary: "redis-server", MaxMemory: "1gb", AppendFsync: "everysec"}
}

// On reports whether the embedded Redis runs, given whether a REDIS_URL is set.
func (c Config) On(haveURL bool) bool {
	if c.Embedded != nil {
		return *c.Embedded
	}
	return !haveURL
}

// Validate checks the section (haveURL: whether REDIS_URL is set).
func (c Config) Validate(haveURL bool) error {
	var errs []error
	if c.Embedded != nil {
		if *c.Embedded && haveURL {
			errs = append(errs, errors.New("redis.embedded is true but REDIS_URL is set: choose one"))
		}
		if !*c.Embedded && !haveURL {
			errs = append(errs, errors.New("redis.embedded is false and REDIS_URL is not set: sandboxd needs a Redis"))
		}
	}
	if c.Binary == "" {
		errs = append(errs, errors.New("redis.binary must not be empty"))
	}
	if n, err := ParseBytes(c.MaxMemory); err != nil {
		errs = append(errs, fmt.Errorf("redis.maxmemory: %w", err))
	} else if n < 16<<20 {
		errs = append(errs, fmt.Errorf("redis.maxmemory must be at least 16mb, got %q", c.MaxMemory))
	}
	switch c.AppendFsync {
	case "everysec", "always":
	default:
		errs = append(errs, fmt.Errorf("redis.appendfsync must be everysec or always, got %q", c.AppendFsync))
	}
	return errors.Join(errs...)
}

// ParseBytes reads a size as Redis does: a number of bytes, or one with a unit k, kb, m, mb,
// g, gb (k = 1000, kb = 1024, and so on).
func ParseBytes(s string) (int64, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	units := []struct {
		suffix string
		mul    int64
	}{{"gb", 1 << 30}, {"mb", 1 << 20}, {"kb", 1 << 10}, {"g", 1e9}, {"m", 1e6}, {"k", 1e3}, {"b", 1}}
	mul := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mul = strings.TrimSuffix(s, u.suffix), u.mul
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<50)/mul {
		return 0, fmt.Errorf("want a size such as 256mb or 1gb")
	}
	return n * mul, nil
}
