package sandbox

import (
	"fmt"
	"strings"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/source"
)

// ProfileConfig is one profile from config: what a sandbox of that kind is built from.
type ProfileConfig struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Rootfs is the read-only base root filesystem folder (local gVisor driver).
	Rootfs string `json:"rootfs,omitempty"`
	// Image is the container image (Kubernetes driver).
	Image string `json:"image,omitempty"`
	// ImageHasInit says that Image carries the guest init at /.sbx/init, as the images
	// scripts/build-images.sh makes do: its pods need no init container (Kubernetes driver).
	ImageHasInit bool  `json:"image_has_init,omitempty"`
	MilliCPU     int64 `json:"milli_cpu,omitempty"`
	MemoryMB     int64 `json:"memory_mb,omitempty"`
	DiskMB       int64 `json:"disk_mb,omitempty"`
	// Network is "none" (the default: only the box's own loopback) or "egress", with
	// EgressAllow (IPv4 CIDRs and host names) and EgressDeny (CIDRs) deciding where a
	// sandbox may connect (internal/netpolicy). A create may narrow it, never widen it.
	Network     string            `json:"network,omitempty"`
	EgressAllow []string          `json:"egress_allow,omitempty"`
	EgressDeny  []string          `json:"egress_deny,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	// WarmPool is how many boxes of the profile each replica keeps booted for creates to
	// claim (pool.go); 0: none, at most MaxWarmPool.
	WarmPool int `json:"warm_pool,omitempty"`
}

// Limits bound everything a client controls.
type Limits struct {
	AutostopDefaultSec int64 `json:"autostop_default_sec"`
	AutostopMinSec     int64 `json:"autostop_min_sec"`
	AutostopMaxSec     int64 `json:"autostop_max_sec"`
	TTLDefaultSec      int64 `json:"ttl_default_sec"`
	TTLMinSec          int64 `json:"ttl_min_sec"`
	TTLMaxSec          int64 `json:"ttl_max_sec"`

	ExecTimeoutDefaultSec int64 `json:"exec_timeout_default_sec"`
	ExecTimeoutMaxSec     int64 `json:"exec_timeout_max_sec"`
	// ExecMaxOutputBytes caps stdout and stderr (each) in a synchronous exec's answer.
	ExecMaxOutputBytes int `json:"exec_max_output_bytes"`
	// ExecMaxArgs and ExecMaxCommandBytes bound the command line; ExecMaxStdinBytes the stdin.
	ExecMaxArgs         int `json:"exec_max_args"`
	ExecMaxCommandBytes int `json:"exec_max_command_bytes"`
	ExecMaxStdinBytes   int `json:"exec_max_stdin_bytes"`
	// ExecMaxEnv bounds the number of environment variables per exec or create.
	ExecMaxEnv int `json:"exec_max_env"`

	// MaxFileBytes bounds one uploaded or downloaded file.
	MaxFileBytes int64 `json:"max_file_bytes"`
	// MaxPathBytes bounds a file path.
	MaxPathBytes int `json:"max_path_bytes"`
	// MaxListEntries bounds one directory listing.
	MaxListEntries int `json:"max_list_entries"`
	// MaxPageSize bounds one page of a sandbox listing.
	MaxPageSize int `json:"max_page_size"`

	// AgentMaxInstructionBytes and AgentMaxConfigBytes bound an agent run's instruction and
	// its agent config (JSON); beyond them a start answers PAYLOAD_TOO_LARGE.
	AgentMaxInstructionBytes int `json:"agent_max_instruction_bytes"`
	AgentMaxConfigBytes      int `json:"agent_max_config_bytes"`

	// MaxLabels bounds the labels of one sandbox (and the terms of one label filter); each
	// label's size is Kubernetes' (labels.go).
	MaxLabels int `json:"max_labels"`
	// File watches (watch.go): how many may exist in one sandbox at once, the directories one
	// recursive watch may hold, the events each keeps for readers that resume, and how long
	// one lives on after its last reader left.
	WatchMaxPerSandbox int `json:"watch_max_per_sandbox"`
	WatchMaxDirs       int `json:"watch_max_dirs"`
	WatchMaxEvents     int `json:"watch_max_events"`
	WatchGraceSec      int `json:"watch_grace_sec"`
}

// DefaultLimits are the limits when config says nothing.
func DefaultLimits() Limits {
	return Limits{
		AutostopDefaultSec: 1800, AutostopMinSec: 1, AutostopMaxSec: 7 * 24 * 3600,
		TTLDefaultSec: 24 * 3600, TTLMinSec: 1, TTLMaxSec: 30 * 24 * 3600,
		ExecTimeoutDefaultSec: 600, ExecTimeoutMaxSec: 24 * 3600,
		ExecMaxOutputBytes: 1 << 20, ExecMaxArgs: 4096, ExecMaxCommandBytes: 256 << 10,
		ExecMaxStdinBytes: 4 << 20, ExecMaxEnv: 256,
		MaxFileBytes: 100 << 20, MaxPathBytes: 4096, MaxListEntries: 10000, MaxPageSize: 500,
		AgentMaxInstructionBytes: 256 << 10, AgentMaxConfigBytes: 64 << 10,
		MaxLabels:          32,
		WatchMaxPerSandbox: 16, WatchMaxDirs: 4096, WatchMaxEvents: 4096, WatchGraceSec: 60,
	}
}

// Config configures the domain: the Service here, and exec (internal/execs) and agent runs
// (internal/agents), which are given it as New checked it (Service.Config).
type Config struct {
	Profiles []ProfileConfig `json:"profiles"`
	// DefaultProfile is used when a create names none.
	DefaultProfile string `json:"default_profile"`
	Limits         Limits `json:"limits"`
	// Network is what every egress policy shares: resolvers and always-denied ranges.
	Network NetworkConfig `json:"network"`
	// LockTTL is the lease of a per-sandbox operation lock (renewed while held).
	LockTTL time.Duration `json:"-"`
	// ExecLease is the follower lease of an exec (renewed every third of it): how long a dead
	// replica's execs wait before another replica follows them on (default 10 s).
	ExecLease time.Duration `json:"-"`
	// MaxExecSubscriptions bounds the exec output streams one replica serves at once (default
	// 1000); more are refused with UNAVAILABLE and a Retry-After.
	MaxExecSubscriptions int `json:"-"`
	// MaxStreamsPerProject bounds the event and output streams one tenant:project holds on one
	// replica at once (default 250); more are refused with LIMIT_EXCEEDED.
	MaxStreamsPerProject int `json:"-"`
	// ReadCacheTTL is how old a box this replica read from the runtime may be when a read
	// serves it (default DefaultReadCacheTTL; see boxcache.go), ReadCacheEntries how many boxes
	// it keeps (default DefaultReadCacheEntries).
	ReadCacheTTL     time.Duration `json:"-"`
	ReadCacheEntries int           `json:"-"`
	// MaxRunningExecs bounds the commands running at once in one sandbox (default 64); more
	// are refused with LIMIT_EXCEEDED. The guest init counts them, so the cap holds across
	// replicas and restarts.
	MaxRunningExecs int `json:"-"`
	// KeepCheckpoints is how many checkpoints (snapshots) of each sandbox are kept: after
	// every checkpoint the older ones are deleted, never the sandbox's latest (default 10).
	KeepCheckpoints int `json:"-"`
	// SourcePrefixes are the GCS prefixes ("gs://bucket/prefix/") each "tenant:project" may
	// create sandboxes from (source.gcs_prefix); a project not named here may use none.
	SourcePrefixes map[string][]string `json:"-"`
	// Agents is the agent catalog: the agents a run may start (agentcatalog.go).
	Agents []AgentConfig `json:"agents"`
}

func (c *Config) validate() error {
	if len(c.Profiles) == 0 {
		return fmt.Errorf("sandbox config: no profiles")
	}
	seen := map[string]bool{}
	for _, p := range c.Profiles {
		if p.Name == "" {
			return fmt.Errorf("sandbox config: a profile has no name")
		}
		if seen[p.Name] {
			return fmt.Errorf("sandbox config: profile %q twice", p.Name)
		}
		seen[p.Name] = true
		if p.WarmPool < 0 || p.WarmPool > MaxWarmPool {
			return fmt.Errorf("sandbox config: profile %q: warm_pool must be between 0 and %d, got %d", p.Name, MaxWarmPool, p.WarmPool)
		}
	}
	if err := c.checkNetwork(); err != nil {
		return err
	}
	if c.DefaultProfile == "" {
		c.DefaultProfile = c.Profiles[0].Name
	}
	if !seen[c.DefaultProfile] {
		return fmt.Errorf("sandbox config: default profile %q is not a profile", c.DefaultProfile)
	}
	l := &c.Limits
	if l.AutostopMinSec > l.AutostopDefaultSec || l.AutostopDefaultSec > l.AutostopMaxSec {
		return fmt.Errorf("sandbox config: autostop bounds must hold min <= default <= max")
	}
	if l.TTLMinSec > l.TTLDefaultSec || l.TTLDefaultSec > l.TTLMaxSec {
		return fmt.Errorf("sandbox config: ttl bounds must hold min <= default <= max")
	}
	if l.ExecTimeoutDefaultSec <= 0 || l.ExecTimeoutDefaultSec > l.ExecTimeoutMaxSec {
		return fmt.Errorf("sandbox config: exec timeout must hold 0 < default <= max")
	}
	if c.LockTTL <= 0 {
		c.LockTTL = 30 * time.Second
	}
	if c.ExecLease <= 0 {
		c.ExecLease = 10 * time.Second
	}
	if c.MaxExecSubscriptions <= 0 {
		c.MaxExecSubscriptions = 1000
	}
	if c.MaxStreamsPerProject <= 0 {
		c.MaxStreamsPerProject = 250
	}
	if c.MaxRunningExecs <= 0 {
		c.MaxRunningExecs = 64
	}
	if c.KeepCheckpoints < 0 {
		return fmt.Errorf("sandbox config: keep checkpoints must be at least 1, got %d", c.KeepCheckpoints)
	}
	if l.AgentMaxInstructionBytes <= 0 {
		l.AgentMaxInstructionBytes = DefaultLimits().AgentMaxInstructionBytes
	}
	if l.AgentMaxConfigBytes <= 0 {
		l.AgentMaxConfigBytes = DefaultLimits().AgentMaxConfigBytes
	}
	if l.MaxLabels <= 0 {
		l.MaxLabels = DefaultLimits().MaxLabels
	}
	if l.MaxLabels > maxLabelsCap {
		return fmt.Errorf("sandbox config: max labels must be at most %d (a sandbox's labels must fit its Kubernetes objects' metadata), got %d", maxLabelsCap, l.MaxLabels)
	}
	if err := l.checkWatch(); err != nil {
		return err
	}
	if err := validateAgents(c.Agents, l); err != nil {
		return err
	}
	if c.KeepCheckpoints == 0 {
		c.KeepCheckpoints = 10
	}
	for scope, prefixes := range c.SourcePrefixes {
		if t, p, ok := strings.Cut(scope, ":"); !ok || !auth.ValidID(t) || !auth.ValidID(p) {
			return fmt.Errorf("sandbox config: source prefixes: %q is not tenant:project", scope)
		}
		for _, pf := range prefixes {
			if _, _, err := source.ParseGCSPrefix(pf); err != nil {
				return fmt.Errorf("sandbox config: source prefixes of %s: %s", scope, apierror.From(err).Message)
			}
		}
	}
	return nil
}
