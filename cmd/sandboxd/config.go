package main

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"sandboxd/internal/auth"
	"sandboxd/internal/checkpoint"
	"sandboxd/internal/execstream"
	"sandboxd/internal/localredis"
	"sandboxd/internal/quota"
	"sandboxd/internal/ratelimit"
	"sandboxd/internal/sandbox"
	"sandboxd/internal/source"
	"sandboxd/internal/tracing"
	"sandboxd/resolvers"
	"sandboxd/runtime/kube"
)

// Config is sandboxd's configuration: the server's own settings, and a section per subsystem
// whose type, defaults and validation live in that subsystem. Precedence: flags > environment
// > config file > defaults; which settings flags and the environment set is the table of
// settings below.
type Config struct {
	// Listen is the HTTP address.
	Listen string `json:"listen"`
	// RedisURL is a redis:// URL; empty runs the embedded Redis (Redis).
	RedisURL string `json:"redis_url"`
	// Redis is the embedded Redis: a redis-server sandboxd runs and supervises under the state
	// folder when RedisURL is empty.
	Redis localredis.Config `json:"redis"`
	// StateDir holds the local runtime's boxes and workspaces.
	StateDir string `json:"state_dir"`
	// CheckpointDir is the local checkpoint store (default StateDir/checkpoint-store).
	CheckpointDir string `json:"checkpoint_dir"`
	// Checkpoints chooses where workspace checkpoints live.
	Checkpoints checkpoint.Config `json:"checkpoints"`
	// Sources configures the bootstrap sources of a create.
	Sources source.Config `json:"sources"`
	// Runtime chooses the runtime driver: "gvisor" (runsc on this host, the default) or "kube"
	// (a gVisor pod and a PVC per sandbox in a Kubernetes namespace).
	Runtime string `json:"runtime"`
	// Kube configures the kube runtime.
	Kube kube.Config `json:"kube"`
	// Image is the container image of the default profile when the profile names none (kube
	// runtime).
	Image string `json:"image"`
	// Runsc is the runsc binary.
	Runsc string `json:"runsc"`
	// InitBinary is the static sandbox-init binary mounted into every sandbox.
	InitBinary string `json:"init_binary"`
	// SpawnerBinary is the static spawner program the init starts commands with (empty:
	// sandbox-spawn beside InitBinary, when there is one).
	SpawnerBinary string `json:"spawner_binary"`
	// Rootfs is the base rootfs of the default profile when the profile names none.
	Rootfs string `json:"rootfs"`

	// APIKeys are the configured keys (hashes only).
	APIKeys []auth.Key `json:"api_keys"`
	// DevTenant and DevProject are the principal of SANDBOX_API_KEY (default dev:default).
	DevTenant  string `json:"dev_tenant"`
	DevProject string `json:"dev_project"`

	Profiles       []sandbox.ProfileConfig `json:"profiles"`
	DefaultProfile string                  `json:"default_profile"`
	Limits         *sandbox.Limits         `json:"limits"`
	// Network holds what every egress policy shares (resolvers, always-denied ranges) and the
	// local runtime's address range for sandboxes with egress.
	Network NetworkConfig `json:"network"`
	// Agents is the agent catalog (agent runs); the default has opencode. A config file's
	// list replaces it.
	Agents []sandbox.AgentConfig `json:"agents"`

	GraphQL resolvers.Config `json:"graphql"`
	// Tracing sends OpenTelemetry traces to an OTLP/HTTP collector; off unless its endpoint is set.
	Tracing tracing.Config `json:"tracing"`

	// RateLimit limits the requests of each API key, across replicas (Redis token buckets):
	// every HTTP request, WebSocket connection and WebSocket operation counts one. Unlimited
	// by default; per-key and per-tenant overrides.
	RateLimit ratelimit.Config `json:"rate_limit"`
	// MaxStreamsPerProject bounds the event and output streams (subscriptions, SSE) one
	// tenant:project holds on one replica (default 250, at most max_subscriptions), so that one
	// project at its cap leaves the rest of the replica's streams to the others.
	MaxStreamsPerProject int `json:"max_streams_per_project"`

	Quota quota.Config `json:"quota"`
	// LockTTLSec is the lease of a per-sandbox operation lock (renewed while its holder lives).
	// A transition left half done by a dead replica is finished once it lapses, so it must not
	// exceed quota.lease_sec: a dead create's slot then comes back within one lease.
	LockTTLSec int `json:"lock_ttl_sec"`
	// ReconcileIntervalMs is how often each replica's reconciler passes over the sandboxes.
	ReconcileIntervalMs int `json:"reconcile_interval_ms"`

	// MaxSubscriptions bounds the subscriptions one replica follows at once (each holds a
	// connection of a dedicated Redis pool while it waits); beyond it a subscribe is refused
	// with UNAVAILABLE and Retry-After.
	MaxSubscriptions int `json:"max_subscriptions"`
	// EventsMaxLen bounds each project's event stream.
	EventsMaxLen int64 `json:"events_max_len"`

	// Execs bounds the exec output streams in Redis, and the commands of a sandbox.
	Execs ExecsConfig `json:"execs"`
	// PprofAddr serves Go's profiles (net/http/pprof) on a listener of their own; empty (the
	// default) serves none. It must be a loopback address: profiles show the process's memory.
	PprofAddr string `json:"pprof_addr"`
	// ShutdownSec bounds graceful shutdown.
	ShutdownSec int    `json:"shutdown_sec"`
	LogLevel    string `json:"log_level"`
	LogFormat   string `json:"log_format"`

	// file is the config file (never read from the file).
	file string
	// devKey is SANDBOX_API_KEY (never read from the file).
	devKey string
}

// ExecsConfig is the execs section: the output streams' settings (execstream's) and the
// bound on the commands of one sandbox.
type ExecsConfig struct {
	execstream.Config
	// MaxRunningPerSandbox bounds the commands running at once in one sandbox (default 64);
	// the sandbox's init counts them, so the bound holds across replicas.
	MaxRunningPerSandbox int `json:"max_running_per_sandbox"`
}

func defaultConfig() Config {
	c := Config{Listen: "127.0.0.1:8780", StateDir: "/var/lib/sandboxd", DevTenant: "dev", DevProject: "default",
		EventsMaxLen: 10000, ShutdownSec: 30, LogLevel: "info", LogFormat: "text",
		LockTTLSec: 30, ReconcileIntervalMs: 5000, MaxSubscriptions: 1000, MaxStreamsPerProject: 250,
		Checkpoints: checkpoint.DefaultConfig(),
		Sources:     source.DefaultConfig(),
		GraphQL:     resolvers.DefaultConfig(),
		Quota:       quota.DefaultConfig(),
		Redis:       localredis.DefaultConfig(),
		Execs:       ExecsConfig{Config: execstream.DefaultConfig(), MaxRunningPerSandbox: 64},
		Tracing:     tracing.DefaultConfig(),
	}
	if os.Geteuid() != 0 {
		if home, err := os.UserHomeDir(); err == nil {
			c.StateDir = filepath.Join(home, ".local", "state", "sandboxd")
		}
	}
	l := sandbox.DefaultLimits()
	c.Limits = &l // a config file's limits are merged over these
	return c
}

// A setting is a value of the config that a flag or the environment sets, over the config
// file. The table of them (settings) is the one place that says so: the flags and their -h
// text, the environment lookups and the hints of config errors are made from it, and a test
// holds the README's table of settings to it.
type setting struct {
	flag string // the flag ("listen" for --listen); "" for none
	env  string // the environment variable, over the config file; "" for none
	// envUnderFile is an environment variable below the config file: it sets the value only
	// when the file leaves it empty.
	envUnderFile string
	key          string // the config file's key ("kube.init_image"); "" when the file has none
	help         string
	val          any // *string, *int or *float64 into the Config
}

// settings is the table of c's settings; each val points into c.
func (c *Config) settings() []setting {
	return []setting{
		{flag: "config", env: "SANDBOXD_CONFIG", help: "config file (YAML or JSON)", val: &c.file},
		{flag: "listen", env: "SANDBOXD_LISTEN", key: "listen", help: "listen address", val: &c.Listen},
		{flag: "redis-url", env: "REDIS_URL", key: "redis_url", help: "Redis URL; empty runs an embedded Redis", val: &c.RedisURL},
		{flag: "redis-server", env: "SANDBOXD_REDIS_SERVER", key: "redis.binary",
			help: "redis-server binary of the embedded Redis", val: &c.Redis.Binary},
		{flag: "redis-maxmemory", env: "SANDBOXD_REDIS_MAXMEMORY", key: "redis.maxmemory",
			help: "maxmemory of the embedded Redis (noeviction: writes beyond it fail)", val: &c.Redis.MaxMemory},
		{flag: "redis-appendfsync", env: "SANDBOXD_REDIS_APPENDFSYNC", key: "redis.appendfsync",
			help: "fsync policy of the embedded Redis's append-only file: everysec or always", val: &c.Redis.AppendFsync},
		{flag: "state-dir", env: "SANDBOXD_STATE_DIR", key: "state_dir", help: "local runtime state folder", val: &c.StateDir},
		{flag: "checkpoint-dir", env: "SANDBOXD_CHECKPOINT_DIR", key: "checkpoint_dir",
			help: "local checkpoint folder (empty: <state dir>/checkpoint-store)", val: &c.CheckpointDir},
		{flag: "runsc", env: "SANDBOXD_RUNSC", key: "runsc", help: "runsc binary", val: &c.Runsc},
		{flag: "init-binary", env: "SANDBOXD_INIT", key: "init_binary", help: "static sandbox-init binary", val: &c.InitBinary},
		{flag: "spawner-binary", env: "SANDBOXD_SPAWNER", key: "spawner_binary",
			help: "static spawner program the init starts commands with (empty: sandbox-spawn beside the init binary, if any)", val: &c.SpawnerBinary},
		{flag: "rootfs", env: "SANDBOXD_ROOTFS", key: "rootfs", help: "base rootfs of the default profile", val: &c.Rootfs},
		{flag: "runtime", env: "SANDBOXD_RUNTIME", key: "runtime", help: "runtime driver: gvisor (default) or kube", val: &c.Runtime},
		{flag: "kubeconfig", env: "SANDBOXD_KUBECONFIG", envUnderFile: "KUBECONFIG", key: "kube.kubeconfig",
			help: "kubeconfig of the kube runtime (empty: in-cluster)", val: &c.Kube.Kubeconfig},
		{flag: "image", env: "SANDBOXD_IMAGE", key: "image", help: "container image of the default profile (kube runtime)", val: &c.Image},
		{env: "SANDBOXD_INIT_IMAGE", key: "kube.init_image", help: "image holding /sandbox-init (kube runtime)", val: &c.Kube.InitImage},
		{flag: "pprof-addr", env: "SANDBOXD_PPROF_ADDR", key: "pprof_addr",
			help: "serve Go's profiles (/debug/pprof/) on this loopback address; empty: off", val: &c.PprofAddr},
		{flag: "log-level", env: "SANDBOXD_LOG_LEVEL", key: "log_level", help: "debug, info, warn or error", val: &c.LogLevel},
		{env: "SANDBOX_API_KEY", help: "development key (at least 8 characters) of dev_tenant:dev_project", val: &c.devKey},
		{env: "SANDBOX_CONCURRENCY_LIMIT", key: "quota.default_limit",
			help: "each tenant:project's concurrency limit; 0 means unlimited", val: &c.Quota.DefaultLimit},
		{flag: "otlp-endpoint", env: "SANDBOXD_OTLP_ENDPOINT", envUnderFile: "OTEL_EXPORTER_OTLP_ENDPOINT", key: "tracing.endpoint",
			help: "OTLP/HTTP collector that traces go to (http://host:4318); empty: tracing off", val: &c.Tracing.Endpoint},
		{env: "OTEL_TRACES_SAMPLER_ARG", key: "tracing.sample_ratio",
			help: "share of new traces recorded, 0 to 1 (a request's traceparent decides for its own)", val: &c.Tracing.SampleRatio},
		{env: "OTEL_SERVICE_NAME", key: "tracing.service_name", help: "service.name of the traces", val: &c.Tracing.ServiceName},
	}
}

// setting returns the setting of val, a pointer into c.
func (c *Config) setting(val any) setting {
	for _, s := range c.settings() {
		if s.val == val {
			return s
		}
	}
	panic(fmt.Sprintf("config: no setting for %T", val))
}

// envs are the environment variables of s, strongest first.
func (s setting) envs() []string {
	var envs []string
	for _, e := range []string{s.env, s.envUnderFile} {
		if e != "" {
			envs = append(envs, e)
		}
	}
	return envs
}

// hint says where s comes from besides the config file: "flag --runsc, env SANDBOXD_RUNSC".
func (s setting) hint() string {
	var from []string
	if s.flag != "" {
		from = append(from, "flag --"+s.flag)
	}
	if envs := s.envs(); len(envs) > 0 {
		from = append(from, "env "+strings.Join(envs, " or "))
	}
	return strings.Join(from, ", ")
}

// usage is s's -h text: its help and its environment variables.
func (s setting) usage() string {
	if envs := s.envs(); len(envs) > 0 {
		return s.help + "; env " + strings.Join(envs, " or ")
	}
	return s.help
}

// String is s's current value as text ("" for an empty string).
func (s setting) String() string {
	switch p := s.val.(type) {
	case *string:
		return *p
	case *int:
		return strconv.Itoa(*p)
	case *float64:
		return strconv.FormatFloat(*p, 'g', -1, 64)
	}
	panic(fmt.Sprintf("config: setting of unsupported type %T", s.val))
}

// set sets s to v, which came from (a flag or an environment variable).
func (s setting) set(v, from string) error {
	switch p := s.val.(type) {
	case *string:
		*p = v
	case *int:
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("%s must be a non-negative integer, got %q", from, v)
		}
		*p = n
	case *float64:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f >= 0) {
			return fmt.Errorf("%s must be a non-negative number, got %q", from, v)
		}
		*p = f
	default:
		panic(fmt.Sprintf("config: setting of unsupported type %T", s.val))
	}
	return nil
}

// override sets s from its flag (given: the flags on the command line) or, failing that, its
// environment variable; an empty value sets nothing.
func (s setting) override(given map[string]string, getenv func(string) string) error {
	if v := given[s.flag]; s.flag != "" && v != "" {
		return s.set(v, "--"+s.flag)
	}
	if v := getenv(s.env); s.env != "" && v != "" {
		return s.set(v, s.env)
	}
	return nil
}

// newFlagSet declares the flags of settings, each with its default as it stands, and a -h
// that lists them and the settings only the environment sets.
func newFlagSet(settings []setting) *flag.FlagSet {
	fs := flag.NewFlagSet("sandboxd", flag.ContinueOnError)
	for _, s := range settings {
		if s.flag != "" {
			fs.String(s.flag, s.String(), s.usage())
		}
	}
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "Usage: sandboxd [flags]\n       sandboxd hash-key KEY\n       sandboxd version\n\n"+
			"Precedence: flags > environment > config file (--config) > defaults.\n\nFlags:\n")
		fs.PrintDefaults()
		fmt.Fprintf(out, "\nEnvironment only:\n")
		tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
		for _, s := range settings {
			if s.flag == "" {
				def := ""
				if v := s.String(); v != "" && s.key != "" {
					def = fmt.Sprintf(" (default %s)", v)
				}
				fmt.Fprintf(tw, "  %s\t%s%s\n", strings.Join(s.envs(), " or "), s.help, def)
			}
		}
		tw.Flush()
	}
	return fs
}

// loadConfig reads flags (args), the environment and the config file into a Config.
func loadConfig(args []string, getenv func(string) string) (Config, error) {
	c := defaultConfig()
	settings := c.settings()
	fs := newFlagSet(settings)
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	given := map[string]string{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = f.Value.String() })
	if err := c.setting(&c.file).override(given, getenv); err != nil {
		return Config{}, err
	}
	if c.file != "" {
		data, err := os.ReadFile(c.file)
		if err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
		if err := yaml.UnmarshalStrict(data, &c); err != nil {
			return Config{}, fmt.Errorf("config %s: %w", c.file, err)
		}
	}
	for _, s := range settings {
		if s.val == &c.file {
			continue
		}
		if v := getenv(s.envUnderFile); s.envUnderFile != "" && v != "" && s.String() == "" {
			if err := s.set(v, s.envUnderFile); err != nil {
				return Config{}, err
			}
		}
		if err := s.override(given, getenv); err != nil {
			return Config{}, err
		}
	}
	if c.CheckpointDir == "" {
		c.CheckpointDir = filepath.Join(c.StateDir, "checkpoint-store")
	}
	if len(c.Profiles) == 0 {
		c.Profiles = []sandbox.ProfileConfig{{
			Name: "sandboxes-default", Description: "Debian bookworm with bash, coreutils, git, curl, python3 and pytest",
			MilliCPU: 1000, MemoryMB: 1024, DiskMB: 10240, Network: "none",
		}}
	}
	if c.Agents == nil {
		c.Agents = DefaultAgents()
	}
	if c.Network.DNSServers == nil {
		c.Network.DNSServers = hostNameservers("/etc/resolv.conf")
	}
	for i := range c.Profiles {
		if c.Profiles[i].Rootfs == "" && c.Profiles[i].Image == "" {
			c.Profiles[i].Rootfs, c.Profiles[i].Image = c.Rootfs, c.Image
		}
	}
	return c, c.validate()
}

// problems appends err's problems to errs: each of a joined error's on its own.
func problems(errs []string, err error) []string {
	if err == nil {
		return errs
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			errs = problems(errs, e)
		}
		return errs
	}
	return append(errs, err.Error())
}

// validate checks the server's own settings and how they fit together, and each section
// with its own Validate.
func (c *Config) validate() error {
	var errs []string
	switch c.Runtime {
	case "", "gvisor":
		if c.Runsc == "" {
			errs = append(errs, fmt.Sprintf("runsc is not set (%s); scripts/run-server.sh builds it", c.setting(&c.Runsc).hint()))
		}
		if c.InitBinary == "" {
			errs = append(errs, fmt.Sprintf("the sandbox-init binary is not set (%s); scripts/run-server.sh builds it",
				c.setting(&c.InitBinary).hint()))
		}
		for _, p := range c.Profiles {
			if p.Rootfs == "" {
				errs = append(errs, fmt.Sprintf("profile %s has no rootfs (%s, or profiles[].rootfs)", p.Name, c.setting(&c.Rootfs).hint()))
			}
		}
	case "kube":
		for _, p := range c.Profiles {
			if p.Image == "" {
				errs = append(errs, fmt.Sprintf("profile %s has no image (%s, or profiles[].image)", p.Name, c.setting(&c.Image).hint()))
			}
			// An image without the guest init gets it from the init image, in an init container.
			if !p.ImageHasInit && c.Kube.InitImage == "" {
				s := c.setting(&c.Kube.InitImage)
				errs = append(errs, fmt.Sprintf("profile %s needs %s (%s): the image holding /sandbox-init, since its image "+
					"does not carry the guest init (image_has_init is false)", p.Name, s.key, s.hint()))
			}
		}
		errs = problems(errs, c.Kube.Validate())
	default:
		errs = append(errs, fmt.Sprintf("runtime must be gvisor or kube, got %q", c.Runtime))
	}
	devKey := c.setting(&c.devKey).env
	if len(c.APIKeys) == 0 && c.devKey == "" {
		errs = append(errs, fmt.Sprintf("no API keys: set %s for a development principal, or api_keys in the config file", devKey))
	}
	if c.devKey != "" && len(c.devKey) < 8 {
		errs = append(errs, devKey+" must be at least 8 characters")
	}
	errs = problems(errs, c.Quota.Validate())
	errs = problems(errs, c.Redis.Validate(c.RedisURL != ""))
	if c.LockTTLSec <= 0 || c.LockTTLSec > c.Quota.LeaseSec {
		errs = append(errs, fmt.Sprintf("lock_ttl_sec must be between 1 and quota.lease_sec (%d), got %d", c.Quota.LeaseSec, c.LockTTLSec))
	}
	errs = problems(errs, c.Checkpoints.Validate())
	errs = problems(errs, c.Sources.Validate())
	if c.MaxSubscriptions < 1 || c.MaxSubscriptions > 100000 {
		errs = append(errs, "max_subscriptions must be between 1 and 100000")
	}
	if c.MaxStreamsPerProject < 1 || c.MaxStreamsPerProject > c.MaxSubscriptions {
		errs = append(errs, fmt.Sprintf("max_streams_per_project must be between 1 and max_subscriptions (%d), got %d",
			c.MaxSubscriptions, c.MaxStreamsPerProject))
	}
	if c.Execs.MaxRunningPerSandbox < 1 || c.Execs.MaxRunningPerSandbox > 1024 {
		errs = append(errs, "execs.max_running_per_sandbox must be between 1 and 1024 (the sandbox init's own bound)")
	}
	errs = problems(errs, c.GraphQL.Validate())
	errs = problems(errs, c.Tracing.Validate())
	// rate_limit's problems stay one entry, a line each, as ratelimit.Config.Validate words them.
	if err := c.RateLimit.Validate(); err != nil {
		errs = append(errs, err.Error())
	}
	var names []string
	for _, k := range c.keys() {
		names = append(names, k.Name)
	}
	if err := c.RateLimit.CheckKeyNames(names); err != nil {
		errs = append(errs, err.Error())
	}
	errs = problems(errs, c.Execs.Config.Validate())
	// The embedded Redis refuses writes when full (noeviction): ended execs' output, kept until
	// its sweep, must leave at least as much again for running execs, events and quotas.
	if maxmem, err := localredis.ParseBytes(c.Redis.MaxMemory); err == nil && c.Redis.On(c.RedisURL != "") && maxmem < 2*c.Execs.MaxEndedBytes {
		errs = append(errs, fmt.Sprintf("redis.maxmemory (%s) must be at least twice execs.max_ended_bytes (%d): a full Redis refuses running execs' output",
			c.Redis.MaxMemory, c.Execs.MaxEndedBytes))
	}
	if err := checkPprofAddr(c.PprofAddr); err != nil {
		errs = append(errs, fmt.Sprintf("%v (%s, or pprof_addr)", err, c.setting(&c.PprofAddr).hint()))
	}
	if c.ReconcileIntervalMs < 100 {
		errs = append(errs, "reconcile_interval_ms must be at least 100")
	}
	if c.ShutdownSec <= 0 {
		c.ShutdownSec = 30
	}
	if len(errs) > 0 {
		return errors.New("config: " + strings.Join(errs, "; "))
	}
	return nil
}

// keys returns the configured keys plus the development key.
func (c *Config) keys() []auth.Key {
	keys := append([]auth.Key(nil), c.APIKeys...)
	if c.devKey != "" {
		keys = append(keys, auth.Key{Name: "SANDBOX_API_KEY", SHA256: auth.HashKey(c.devKey), Tenant: c.DevTenant, Project: c.DevProject})
	}
	return keys
}

// NetworkConfig is the `network` section.
type NetworkConfig struct {
	sandbox.NetworkConfig
	// LocalSubnet is the IPv4 range the local runtime gives sandboxes with egress a /30 of
	// each from (default 10.213.0.0/16).
	LocalSubnet string `json:"local_subnet"`
}

// hostNameservers are the IPv4 nameservers of the host's resolv.conf that a sandbox could
// reach: none on loopback (a sandbox's own loopback is not the host's).
func hostNameservers(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(f[1])
		if err != nil || !a.Is4() || a.IsLoopback() || slices.Contains(out, a.String()) {
			continue
		}
		out = append(out, a.String())
	}
	return out
}

// sandboxConfig is the domain's config: the server's settings and what the sections hand it.
func (c *Config) sandboxConfig() sandbox.Config {
	return sandbox.Config{Profiles: c.Profiles, DefaultProfile: c.DefaultProfile, Limits: *c.Limits,
		LockTTL: time.Duration(c.LockTTLSec) * time.Second, ExecLease: c.Execs.FollowLease(),
		MaxExecSubscriptions: c.MaxSubscriptions, KeepCheckpoints: c.Checkpoints.KeepLast,
		MaxStreamsPerProject: c.MaxStreamsPerProject, MaxRunningExecs: c.Execs.MaxRunningPerSandbox,
		SourcePrefixes: c.Sources.GCSPrefixes, Agents: c.Agents, Network: c.Network.NetworkConfig}
}

// graphqlOptions are the GraphQL handler's options from the config: the graphql section's,
// with the exec output cap and the label limit of the limits.
func (c *Config) graphqlOptions() resolvers.HandlerOptions {
	o := c.GraphQL.HandlerOptions()
	o.OutputFieldBytes = int64(c.Limits.ExecMaxOutputBytes)
	o.MaxLabels = c.Limits.MaxLabels
	return o
}

// DefaultAgents is the agent catalog when config names none: opencode, attached to a running
// sandbox. Its command line is a plausible default; a config file's `agents` replaces it.
func DefaultAgents() []sandbox.AgentConfig {
	return []sandbox.AgentConfig{{
		ID: "opencode", Description: "opencode CLI (must be in the sandbox image)",
		Integrations: []string{sandbox.IntegrationSandbox, "harbor"}, Binary: "opencode",
		Command: []string{"opencode", "run", "--model", "{{model}}", "--file", "{{instruction_file}}",
			"Follow the attached instruction."},
	}}
}
