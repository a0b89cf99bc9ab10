package main

import (
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/execstream"
	"sandboxd/internal/quota"
	"sandboxd/internal/ratelimit"
	"sandboxd/internal/sandbox"
	"sandboxd/internal/source"
	"sandboxd/resolvers"
)

// KubeConfig configures the kube runtime (runtime/kube).
type KubeConfig struct {
	// Kubeconfig is a kubeconfig file; empty means in-cluster (the pod's service account).
	// Env SANDBOXD_KUBECONFIG, then KUBECONFIG.
	Kubeconfig string `json:"kubeconfig"`
	// Namespace holds the sandboxes' pods and PVCs (default sandbox-jobs).
	Namespace string `json:"namespace"`
	// InitImage is the image holding the static guest init at /sandbox-init (its init
	// container copies it into each pod). Env SANDBOXD_INIT_IMAGE.
	InitImage string `json:"init_image"`
	// StorageClass is the workspace PVCs' storage class; empty takes the cluster's default.
	StorageClass string `json:"storage_class"`
	// RuntimeClass is the pods' runtimeClassName (default gvisor).
	RuntimeClass string `json:"runtime_class"`
	// ReadyTimeoutSec bounds a create's or start's wait for its pod (default 120).
	ReadyTimeoutSec int `json:"ready_timeout_sec"`
	// UnschedulableTimeoutSec is how long a pod may stay unschedulable before a create or
	// start fails with the scheduler's reason (default 30).
	UnschedulableTimeoutSec int `json:"unschedulable_timeout_sec"`
}

// Config is sandboxd's configuration. Precedence: flags > environment > config file > defaults.
type Config struct {
	// Listen is the HTTP address (default 127.0.0.1:8780). Env SANDBOXD_LISTEN.
	Listen string `json:"listen"`
	// RedisURL is a redis:// URL; empty runs an embedded in-process Redis. Env REDIS_URL.
	RedisURL string `json:"redis_url"`
	// StateDir holds the local runtime's boxes and workspaces. Env SANDBOXD_STATE_DIR.
	StateDir string `json:"state_dir"`
	// CheckpointDir is the local checkpoint store (default StateDir/checkpoint-store).
	// Env SANDBOXD_CHECKPOINT_DIR.
	CheckpointDir string `json:"checkpoint_dir"`
	// Checkpoints chooses where workspace checkpoints live.
	Checkpoints struct {
		// Store is "local" (CheckpointDir, the default) or "gcs".
		Store string `json:"store"`
		// GCSBucket and GCSPrefix locate the objects in GCS. Credentials come from the
		// application-default chain; STORAGE_EMULATOR_HOST points the client at an emulator.
		GCSBucket string `json:"gcs_bucket"`
		GCSPrefix string `json:"gcs_prefix"`
		// KeepLast is how many snapshots of each sandbox are kept (default 10): after every
		// checkpoint (stop, destroy, snapshot) older ones are deleted, never the latest.
		KeepLast int `json:"keep_last"`
	} `json:"checkpoints"`
	// Sources configures the bootstrap sources of a create (source.archive_url and
	// source.gcs_prefix; source.snapshot_id needs nothing).
	Sources struct {
		// AllowHosts are "host" or "host:port" patterns an archive URL may name even when they
		// resolve to a loopback, private or link-local address (and over plain http): for
		// on-prem mirrors and tests. Empty by default: only public addresses.
		AllowHosts []string `json:"allow_hosts"`
		// CAFile is a PEM file of extra CA certificates that archive hosts are verified
		// against, besides the system's (e.g. an on-prem mirror's, or a test server's).
		CAFile string `json:"ca_file"`
		// GCSPrefixes are the GCS prefixes each "tenant:project" may bootstrap from
		// ("gs://bucket/prefix/"; "gs://bucket" for the whole bucket). None by default.
		GCSPrefixes map[string][]string `json:"gcs_prefixes"`
		// MaxDownloadBytes bounds an archive's download; MaxFiles the entries of a source;
		// MaxTotalBytes its uncompressed content (internal/source's defaults: 1 GiB,
		// 100,000, 4 GiB). The workspace import applies the same limits.
		MaxDownloadBytes int64 `json:"max_download_bytes"`
		MaxFiles         int   `json:"max_files"`
		MaxTotalBytes    int64 `json:"max_total_bytes"`
	} `json:"sources"`
	// Runtime chooses the runtime driver: "gvisor" (runsc on this host, the default) or "kube"
	// (a gVisor pod and a PVC per sandbox in a Kubernetes namespace). Env SANDBOXD_RUNTIME.
	Runtime string `json:"runtime"`
	// Kube configures the kube runtime.
	Kube KubeConfig `json:"kube"`
	// Image is the container image of the default profile when the profile names none (kube
	// runtime). Env SANDBOXD_IMAGE.
	Image string `json:"image"`
	// Runsc is the runsc binary. Env SANDBOXD_RUNSC.
	Runsc string `json:"runsc"`
	// InitBinary is the static sandbox-init binary mounted into every sandbox. Env SANDBOXD_INIT.
	InitBinary string `json:"init_binary"`
	// Rootfs is the base rootfs of the default profile when the profile names none.
	// Env SANDBOXD_ROOTFS.
	Rootfs string `json:"rootfs"`

	// APIKeys are the configured keys (hashes only).
	APIKeys []auth.Key `json:"api_keys"`
	// DevTenant and DevProject are the principal of SANDBOX_API_KEY (default dev:default).
	DevTenant  string `json:"dev_tenant"`
	DevProject string `json:"dev_project"`

	Profiles       []sandbox.ProfileConfig `json:"profiles"`
	DefaultProfile string                  `json:"default_profile"`
	Limits         *sandbox.Limits         `json:"limits"`
	// Agents is the agent catalog (agent runs); the default has opencode. A config file's
	// list replaces it.
	Agents []sandbox.AgentConfig `json:"agents"`

	GraphQL struct {
		// AllowedOrigins are the Origin host patterns ("dashboard.example.com", "*.example.com")
		// whose pages may call the API from a browser, besides the server's own host: the
		// GraphQL WebSocket's Origin check, and CORS for /graphql and the REST paths.
		AllowedOrigins []string `json:"allowed_origins"`
		KeepAliveSec   int      `json:"keepalive_sec"`
		// ComplexityLimit is the points budget of one operation (default 10,000); see the
		// README's "Limits" for the prices.
		ComplexityLimit int `json:"complexity_limit"`
		// MaxReadBytes bounds the bytes one operation may read into its answer: readFile's
		// maxBytes and exec output fields, counted before it runs (default 16 MiB).
		MaxReadBytes int64 `json:"max_read_bytes"`
		// MaxMutationFields bounds the mutation fields of one operation (default 10).
		MaxMutationFields int `json:"max_mutation_fields"`
		// MaxOperationsPerConnection bounds the operations open at once on one WebSocket
		// (default 100).
		MaxOperationsPerConnection int `json:"max_operations_per_connection"`
		// Introspection answers __schema and __type to callers with a key (default true).
		Introspection *bool `json:"introspection"`
	} `json:"graphql"`

	// RateLimit limits the requests of each API key, across replicas (Redis token buckets):
	// every HTTP request, WebSocket connection and WebSocket operation counts one. Unlimited
	// by default; per-key and per-tenant overrides.
	RateLimit ratelimit.Config `json:"rate_limit"`
	// MaxStreamsPerProject bounds the event and output streams (subscriptions, SSE) one
	// tenant:project holds on one replica (default 250, at most max_subscriptions), so that one
	// project at its cap leaves the rest of the replica's streams to the others.
	MaxStreamsPerProject int `json:"max_streams_per_project"`

	Quota struct {
		// DefaultLimit is each tenant:project's concurrency limit (sandboxes CREATING,
		// STARTING or RUNNING); 0 means unlimited. Env SANDBOX_CONCURRENCY_LIMIT.
		DefaultLimit int `json:"default_limit"`
		// Limits overrides it per "tenant:project".
		Limits map[string]int `json:"limits"`
		// LeaseSec is a slot lease; the reconciler renews live ones.
		LeaseSec int `json:"lease_sec"`
		// RetryAfterSec is the Retry-After of a full project.
		RetryAfterSec int `json:"retry_after_sec"`
	} `json:"quota"`
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

	// Execs bounds the exec output streams in Redis.
	Execs struct {
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
		// MaxRunningPerSandbox bounds the commands running at once in one sandbox (default 64);
		// the sandbox's init counts them, so the bound holds across replicas.
		MaxRunningPerSandbox int `json:"max_running_per_sandbox"`
	} `json:"execs"`
	// ShutdownSec bounds graceful shutdown.
	ShutdownSec int    `json:"shutdown_sec"`
	LogLevel    string `json:"log_level"`
	LogFormat   string `json:"log_format"`

	// devKey is SANDBOX_API_KEY (never read from the file).
	devKey string
}

func defaultConfig() Config {
	c := Config{Listen: "127.0.0.1:8780", DevTenant: "dev", DevProject: "default", EventsMaxLen: 10000,
		ShutdownSec: 30, LogLevel: "info", LogFormat: "text"}
	c.StateDir = "/var/lib/sandboxd"
	if os.Geteuid() != 0 {
		if home, err := os.UserHomeDir(); err == nil {
			c.StateDir = filepath.Join(home, ".local", "state", "sandboxd")
		}
	}
	l := sandbox.DefaultLimits()
	c.Limits = &l // a config file's limits are merged over these
	c.GraphQL.KeepAliveSec = 15
	c.Quota.DefaultLimit = 10
	c.Quota.LeaseSec = 60
	c.Quota.RetryAfterSec = 5
	c.ReconcileIntervalMs = 5000
	c.LockTTLSec = 30
	c.MaxSubscriptions = 1000
	c.Execs.StreamMaxEntries = 50000
	c.Execs.StreamMaxBytes = 16 << 20
	c.Execs.RetentionSec = 3600
	c.Execs.MaxEndedBytes = 256 << 20
	c.Execs.FollowLeaseSec = 10
	c.GraphQL.ComplexityLimit = resolvers.DefaultCostLimit
	c.GraphQL.MaxReadBytes = resolvers.DefaultMaxReadBytes
	c.GraphQL.MaxMutationFields = resolvers.DefaultMaxMutationFields
	c.GraphQL.MaxOperationsPerConnection = resolvers.DefaultMaxOperationsPerConnection
	c.MaxStreamsPerProject = 250
	c.Execs.MaxRunningPerSandbox = 64
	c.Checkpoints.KeepLast = 10
	c.Sources.MaxDownloadBytes = source.DefaultMaxDownloadBytes
	c.Sources.MaxFiles = source.DefaultMaxFiles
	c.Sources.MaxTotalBytes = source.DefaultMaxTotalBytes
	return c
}

// loadConfig reads flags (args), the environment and the config file into a Config.
func loadConfig(args []string, getenv func(string) string) (Config, error) {
	fs := flag.NewFlagSet("sandboxd", flag.ContinueOnError)
	configPath := fs.String("config", getenv("SANDBOXD_CONFIG"), "config file (YAML or JSON); env SANDBOXD_CONFIG")
	listen := fs.String("listen", "", "listen address (default 127.0.0.1:8780); env SANDBOXD_LISTEN")
	redisURL := fs.String("redis-url", "", "Redis URL; empty runs an embedded Redis; env REDIS_URL")
	stateDir := fs.String("state-dir", "", "local runtime state folder; env SANDBOXD_STATE_DIR")
	ckptDir := fs.String("checkpoint-dir", "", "local checkpoint folder; env SANDBOXD_CHECKPOINT_DIR")
	runsc := fs.String("runsc", "", "runsc binary; env SANDBOXD_RUNSC")
	initBin := fs.String("init-binary", "", "static sandbox-init binary; env SANDBOXD_INIT")
	rootfs := fs.String("rootfs", "", "base rootfs of the default profile; env SANDBOXD_ROOTFS")
	runtimeName := fs.String("runtime", "", "runtime driver: gvisor (default) or kube; env SANDBOXD_RUNTIME")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the kube runtime (empty: in-cluster); env SANDBOXD_KUBECONFIG or KUBECONFIG")
	image := fs.String("image", "", "container image of the default profile (kube runtime); env SANDBOXD_IMAGE")
	logLevel := fs.String("log-level", "", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	c := defaultConfig()
	if *configPath != "" {
		data, err := os.ReadFile(*configPath)
		if err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
		if err := yaml.UnmarshalStrict(data, &c); err != nil {
			return Config{}, fmt.Errorf("config %s: %w", *configPath, err)
		}
	}
	pick := func(dst *string, flagVal, env string) {
		if v := getenv(env); v != "" {
			*dst = v
		}
		if flagVal != "" {
			*dst = flagVal
		}
	}
	pick(&c.Listen, *listen, "SANDBOXD_LISTEN")
	pick(&c.RedisURL, *redisURL, "REDIS_URL")
	pick(&c.StateDir, *stateDir, "SANDBOXD_STATE_DIR")
	pick(&c.CheckpointDir, *ckptDir, "SANDBOXD_CHECKPOINT_DIR")
	pick(&c.Runsc, *runsc, "SANDBOXD_RUNSC")
	pick(&c.InitBinary, *initBin, "SANDBOXD_INIT")
	pick(&c.Rootfs, *rootfs, "SANDBOXD_ROOTFS")
	pick(&c.Runtime, *runtimeName, "SANDBOXD_RUNTIME")
	pick(&c.Image, *image, "SANDBOXD_IMAGE")
	pick(&c.Kube.InitImage, "", "SANDBOXD_INIT_IMAGE")
	if c.Kube.Kubeconfig == "" {
		pick(&c.Kube.Kubeconfig, "", "KUBECONFIG")
	}
	pick(&c.Kube.Kubeconfig, *kubeconfig, "SANDBOXD_KUBECONFIG")
	pick(&c.LogLevel, *logLevel, "SANDBOXD_LOG_LEVEL")
	c.devKey = getenv("SANDBOX_API_KEY")
	if v := getenv("SANDBOX_CONCURRENCY_LIMIT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return Config{}, fmt.Errorf("SANDBOX_CONCURRENCY_LIMIT must be a non-negative integer, got %q", v)
		}
		c.Quota.DefaultLimit = n
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
	for i := range c.Profiles {
		if c.Profiles[i].Rootfs == "" && c.Profiles[i].Image == "" {
			c.Profiles[i].Rootfs, c.Profiles[i].Image = c.Rootfs, c.Image
		}
	}
	return c, c.validate()
}

func (c *Config) validate() error {
	var errs []string
	switch c.Runtime {
	case "", "gvisor":
		if c.Runsc == "" {
			errs = append(errs, "runsc is not set (flag --runsc, env SANDBOXD_RUNSC); scripts/run-server.sh builds it")
		}
		if c.InitBinary == "" {
			errs = append(errs, "the sandbox-init binary is not set (flag --init-binary, env SANDBOXD_INIT); scripts/run-server.sh builds it")
		}
		for _, p := range c.Profiles {
			if p.Rootfs == "" {
				errs = append(errs, fmt.Sprintf("profile %s has no rootfs (flag --rootfs, env SANDBOXD_ROOTFS, or profiles[].rootfs)", p.Name))
			}
		}
	case "kube":
		if c.Kube.InitImage == "" {
			errs = append(errs, "the kube runtime needs kube.init_image (env SANDBOXD_INIT_IMAGE): the image holding /sandbox-init")
		}
		for _, p := range c.Profiles {
			if p.Image == "" {
				errs = append(errs, fmt.Sprintf("profile %s has no image (flag --image, env SANDBOXD_IMAGE, or profiles[].image)", p.Name))
			}
		}
		if c.Kube.ReadyTimeoutSec < 0 || c.Kube.UnschedulableTimeoutSec < 0 {
			errs = append(errs, "kube: ready_timeout_sec and unschedulable_timeout_sec must not be negative")
		}
	default:
		errs = append(errs, fmt.Sprintf("runtime must be gvisor or kube, got %q", c.Runtime))
	}
	if len(c.APIKeys) == 0 && c.devKey == "" {
		errs = append(errs, "no API keys: set SANDBOX_API_KEY for a development principal, or api_keys in the config file")
	}
	if c.devKey != "" && len(c.devKey) < 8 {
		errs = append(errs, "SANDBOX_API_KEY must be at least 8 characters")
	}
	if c.Quota.DefaultLimit < 0 || c.Quota.LeaseSec <= 0 || c.Quota.RetryAfterSec <= 0 {
		errs = append(errs, "quota: default_limit must be >= 0, lease_sec and retry_after_sec > 0")
	}
	for scope, n := range c.Quota.Limits {
		if t, p, ok := strings.Cut(scope, ":"); !ok || !auth.ValidID(t) || !auth.ValidID(p) || n < 0 {
			errs = append(errs, fmt.Sprintf("quota.limits: %q must be tenant:project with a limit >= 0", scope))
		}
	}
	if c.LockTTLSec <= 0 || c.LockTTLSec > c.Quota.LeaseSec {
		errs = append(errs, fmt.Sprintf("lock_ttl_sec must be between 1 and quota.lease_sec (%d), got %d", c.Quota.LeaseSec, c.LockTTLSec))
	}
	switch c.Checkpoints.Store {
	case "", "local":
	case "gcs":
		if c.Checkpoints.GCSBucket == "" {
			errs = append(errs, "checkpoints.store gcs needs checkpoints.gcs_bucket")
		}
	default:
		errs = append(errs, fmt.Sprintf("checkpoints.store must be local or gcs, got %q", c.Checkpoints.Store))
	}
	if c.Checkpoints.KeepLast < 1 {
		errs = append(errs, fmt.Sprintf("checkpoints.keep_last must be at least 1, got %d", c.Checkpoints.KeepLast))
	}
	errs = append(errs, c.validateSources()...)
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
	if c.GraphQL.ComplexityLimit < 1 || c.GraphQL.MaxReadBytes < 1 || c.GraphQL.MaxMutationFields < 1 || c.GraphQL.MaxOperationsPerConnection < 1 {
		errs = append(errs, "graphql: complexity_limit, max_read_bytes, max_mutation_fields and max_operations_per_connection must be at least 1")
	}
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
	if c.Execs.StreamMaxEntries < 100 || c.Execs.StreamMaxBytes < 64<<10 || c.Execs.StreamMaxBytes > 1<<30 {
		errs = append(errs, "execs: stream_max_entries must be at least 100 and stream_max_bytes between 65536 and 1 GiB")
	}
	if c.Execs.RetentionSec < 1 || c.Execs.FollowLeaseSec < 3 || c.Execs.FollowLeaseSec > 600 {
		errs = append(errs, "execs: retention_sec must be at least 1 and follow_lease_sec between 3 and 600")
	}
	if c.Execs.MaxEndedBytes < c.Execs.StreamMaxBytes {
		errs = append(errs, "execs: max_ended_bytes must be at least stream_max_bytes")
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

// validateSources checks the sources section: scopes, prefixes, limits, hosts and the CA file.
func (c *Config) validateSources() []string {
	var errs []string
	for scope, prefixes := range c.Sources.GCSPrefixes {
		if t, p, ok := strings.Cut(scope, ":"); !ok || !auth.ValidID(t) || !auth.ValidID(p) {
			errs = append(errs, fmt.Sprintf("sources.gcs_prefixes: %q must be tenant:project", scope))
			continue
		}
		for _, pf := range prefixes {
			if _, _, err := source.ParseGCSPrefix(pf); err != nil {
				errs = append(errs, fmt.Sprintf("sources.gcs_prefixes[%s]: %s (want gs://bucket/prefix/)", scope, apierror.From(err).Message))
			}
		}
	}
	if c.Sources.MaxDownloadBytes <= 0 || c.Sources.MaxFiles <= 0 || c.Sources.MaxTotalBytes <= 0 {
		errs = append(errs, "sources: max_download_bytes, max_files and max_total_bytes must be > 0")
	}
	if _, err := c.sourceOptions(); err != nil {
		errs = append(errs, err.Error())
	}
	return errs
}

// sourceOptions are the bootstrap fetcher's options: the limits, the allow list, and the
// system's roots plus the certificates of sources.ca_file.
func (c *Config) sourceOptions() (source.Options, error) {
	opts := source.Options{AllowHosts: c.Sources.AllowHosts, MaxDownloadBytes: c.Sources.MaxDownloadBytes,
		MaxFiles: c.Sources.MaxFiles, MaxTotalBytes: c.Sources.MaxTotalBytes}
	if c.Sources.CAFile != "" {
		data, err := os.ReadFile(c.Sources.CAFile)
		if err != nil {
			return opts, fmt.Errorf("sources.ca_file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(data) {
			return opts, fmt.Errorf("sources.ca_file %s holds no PEM certificate", c.Sources.CAFile)
		}
		opts.RootCAs = pool
	}
	if _, err := source.New(opts); err != nil { // checks the allow list
		return opts, fmt.Errorf("sources.allow_hosts: %w", err)
	}
	return opts, nil
}

// keys returns the configured keys plus the development key.
func (c *Config) keys() []auth.Key {
	keys := append([]auth.Key(nil), c.APIKeys...)
	if c.devKey != "" {
		keys = append(keys, auth.Key{Name: "SANDBOX_API_KEY", SHA256: auth.HashKey(c.devKey), Tenant: c.DevTenant, Project: c.DevProject})
	}
	return keys
}

func (c *Config) sandboxConfig() sandbox.Config {
	return sandbox.Config{Profiles: c.Profiles, DefaultProfile: c.DefaultProfile, Limits: *c.Limits,
		LockTTL: time.Duration(c.LockTTLSec) * time.Second, ExecLease: time.Duration(c.Execs.FollowLeaseSec) * time.Second,
		MaxExecSubscriptions: c.MaxSubscriptions, KeepCheckpoints: c.Checkpoints.KeepLast,
		MaxStreamsPerProject: c.MaxStreamsPerProject, MaxRunningExecs: c.Execs.MaxRunningPerSandbox,
		SourcePrefixes: c.Sources.GCSPrefixes, Agents: c.Agents}
}

func (c *Config) execOptions() execstream.Options {
	return execstream.Options{MaxLen: c.Execs.StreamMaxEntries, MaxBytes: c.Execs.StreamMaxBytes,
		Retention: time.Duration(c.Execs.RetentionSec) * time.Second, MaxEndedBytes: c.Execs.MaxEndedBytes}
}

// graphqlOptions are the GraphQL handler's options from the config.
func (c *Config) graphqlOptions() resolvers.HandlerOptions {
	return resolvers.HandlerOptions{
		AllowedOrigins: c.GraphQL.AllowedOrigins, KeepAlivePingInterval: c.keepAlive(),
		ComplexityLimit: c.GraphQL.ComplexityLimit, MaxReadBytes: c.GraphQL.MaxReadBytes,
		MaxMutationFields: c.GraphQL.MaxMutationFields, MaxOperationsPerConnection: c.GraphQL.MaxOperationsPerConnection,
		OutputFieldBytes:     int64(c.Limits.ExecMaxOutputBytes),
		DisableIntrospection: c.GraphQL.Introspection != nil && !*c.GraphQL.Introspection,
	}
}

func (c *Config) keepAlive() time.Duration {
	return time.Duration(c.GraphQL.KeepAliveSec) * time.Second
}

func (c *Config) quotaOptions() quota.Options {
	return quota.Options{
		Limits:     quota.Limits{Default: c.Quota.DefaultLimit, PerScope: c.Quota.Limits},
		Lease:      time.Duration(c.Quota.LeaseSec) * time.Second,
		RetryAfter: time.Duration(c.Quota.RetryAfterSec) * time.Second,
	}
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
