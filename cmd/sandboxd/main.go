// Command sandboxd is the sandbox control plane: REST at /sandbox/sandboxes/v1 (agent runs at
// /sandbox/agent/v1/runs), GraphQL at /graphql, health at /healthz and /readyz, Prometheus
// metrics at /metrics. With no REDIS_URL it runs and supervises its own redis-server under the
// state folder (internal/localredis); its default runtime runs gVisor sandboxes on this host
// with runsc.
//
//	sandboxd [flags]             serve (see -h)
//	sandboxd hash-key KEY        print the sha256 of an API key, for api_keys in the config
//	sandboxd version             print the version, revision and Go version (also --version)
package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	kuberest "k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"sandboxd/internal/agentrun"
	"sandboxd/internal/auth"
	"sandboxd/internal/checkpoint"
	"sandboxd/internal/dashboard"
	"sandboxd/internal/domain"
	"sandboxd/internal/events"
	"sandboxd/internal/execs"
	"sandboxd/internal/execstream"
	"sandboxd/internal/localredis"
	"sandboxd/internal/quota"
	"sandboxd/internal/ratelimit"
	"sandboxd/internal/rest"
	"sandboxd/internal/sandbox"
	"sandboxd/internal/source"
	"sandboxd/internal/store"
	"sandboxd/internal/tracing"
	"sandboxd/internal/version"
	"sandboxd/resolvers"
	"sandboxd/runtime"
	"sandboxd/runtime/gvisor"
	"sandboxd/runtime/kube"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "hash-key" {
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: sandboxd hash-key KEY")
			os.Exit(2)
		}
		fmt.Println(auth.HashKey(os.Args[2]))
		return
	}
	if len(os.Args) == 2 && isVersionArg(os.Args[1]) {
		fmt.Println(version.String("sandboxd"))
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string) error {
	cfg, err := loadConfig(args, getenv)
	if err != nil {
		return err
	}
	log := newLogger(cfg)
	slog.SetDefault(log)
	setMemoryLimit(getenv, log)
	stopTracing, err := tracing.Setup(ctx, cfg.Tracing, tracing.Options{Logger: log, Version: version.Version})
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	defer flushTraces(stopTracing, log) // last: after the server and the service have ended their spans

	// The embedded Redis is closed last (defers run in reverse): after the HTTP server, the
	// reconciler and the service have stopped using it.
	var local *localredis.Server
	if cfg.Redis.On(cfg.RedisURL != "") {
		local, err = localredis.Start(ctx, localredis.Options{Config: cfg.Redis, Dir: filepath.Join(cfg.StateDir, "redis"), Logger: log})
		if err != nil {
			return err
		}
		defer local.Close()
	}
	rdb, blocking, limiterRedis, closeRedis, err := openRedis(ctx, cfg.RedisURL, local, cfg.MaxSubscriptions)
	if err != nil {
		return err
	}
	defer closeRedis()
	tracing.Redis(rdb, blocking, limiterRedis)

	driver, closeDriver, err := openDriver(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeDriver()
	traced := tracing.Driver(driver) // the domain's calls are spans; /readyz's checks are not
	objs, closeObjs, err := openCheckpointStore(ctx, cfg)
	if err != nil {
		return fmt.Errorf("checkpoint store: %w", err)
	}
	defer closeObjs()
	srcOpts, err := cfg.Sources.Options()
	if err != nil {
		return err
	}
	sources, err := source.New(srcOpts)
	if err != nil {
		return fmt.Errorf("sources: %w", err)
	}
	gcsSources := &lazyGCS{} // its client is made on the first create from a GCS prefix
	defer gcsSources.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if local != nil {
		reg.MustRegister(local.Collector())
	}
	reg.MustRegister(buildInfo())
	execOpts := cfg.Execs.Options()
	execOpts.Blocking = blocking
	execStore := execstream.New(rdb, execOpts)
	svc, err := domain.New(cfg.sandboxConfig(), domain.Deps{
		Driver:        traced,
		Store:         store.New(rdb, lookupSource(traced)),
		Events:        events.New(rdb, events.Options{MaxLen: cfg.EventsMaxLen, Blocking: blocking, MaxSubscribers: cfg.MaxSubscriptions}),
		Checkpoints:   checkpoint.New(objs, checkpoint.Options{}),
		Execs:         execStore,
		AgentRuns:     agentrun.New(rdb, agentrun.Options{}),
		Quota:         quota.New(rdb, sandbox.SlotSource(traced), cfg.Quota.Options()),
		Sources:       sources,
		SourceObjects: gcsSources,
		Pooler:        poolerOf(driver),
		Metrics:       sandbox.NewMetrics(reg),
		ExecMetrics:   execs.NewMetrics(reg),
		Logger:        log,
	})
	if err != nil {
		return err
	}
	defer svc.Close()
	reg.MustRegister(sandbox.NewStateCollector(svc.CountByState))
	authn, err := auth.New(cfg.keys())
	if err != nil {
		return err
	}

	// Ending shutdown ends open WebSocket and SSE streams, which http.Server.Shutdown does not.
	shutdown, endStreams := context.WithCancel(context.Background())
	defer endStreams()
	limiter, err := ratelimit.New(limiterRedis, cfg.RateLimit, ratelimit.Options{})
	if err != nil {
		return fmt.Errorf("rate_limit: %w", err)
	}
	limit := rateLimit(limiter, log)
	cors := corsFor(cfg.GraphQL.AllowedOrigins)
	gqlOpts := cfg.graphqlOptions()
	gqlOpts.Logger, gqlOpts.Shutdown, gqlOpts.RateLimit = log, shutdown, limit
	site, err := dashboard.New()
	if err != nil {
		return err
	}
	mux := newMux(handlers{
		ready:     readyz(rdb, driver),
		metrics:   promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}),
		graphql:   cors(resolvers.NewHandler(svc, authn, gqlOpts)),
		graphiql:  site.GraphiQL(),
		dashboard: site.Index(),
		ui:        site.Assets(),
		rest:      cors(rest.New(svc, authn, log, shutdown.Done()).WithRateLimit(limit).WithAllowedOrigins(cfg.GraphQL.AllowedOrigins)),
		openapi:   cors(rest.OpenAPIHandler(log)),
	})

	// The reconciler runs in every replica until shutdown.
	rctx, stopReconciler := context.WithCancel(context.WithoutCancel(ctx))
	reconcilerDone := make(chan struct{})
	go func() {
		defer close(reconcilerDone)
		svc.RunReconciler(rctx, time.Duration(cfg.ReconcileIntervalMs)*time.Millisecond)
	}()
	defer func() {
		stopReconciler()
		<-reconcilerDone
	}()

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if cfg.PprofAddr != "" {
		stopPprof, err := startPprof(cfg.PprofAddr, log)
		if err != nil {
			ln.Close()
			return err
		}
		defer stopPprof()
	}
	srv := &http.Server{
		Handler:           instrument(mux, reg),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("sandboxd listening", "addr", ln.Addr().String(), "runtime", driver.Name(), "state_dir", cfg.StateDir,
		"checkpoints", checkpointLocation(cfg), "redis", cmp.Or(source.RedactURL(cfg.RedisURL), "embedded: "+redisSocket(local)), "profiles", len(cfg.Profiles), "keys", authn.Len())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: sandboxes keep running")
	sctx, cancel := context.WithTimeout(context.Background(), time.Duration(cfg.ShutdownSec)*time.Second)
	defer cancel()
	srv.RegisterOnShutdown(svc.Close)
	endStreams()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("graceful shutdown cut short", "err", err)
	}
	return nil
}

// flushTraces exports the spans still queued and stops the tracer provider, within 5 s.
func flushTraces(stop func(context.Context) error, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := stop(ctx); err != nil {
		log.Warn("tracing: flushing spans at shutdown failed", "err", err)
	}
}

// handlers are what the server's mux serves, besides /healthz.
type handlers struct {
	ready, metrics, graphql, graphiql http.Handler
	// dashboard serves the web dashboard's page at exactly "/", ui its scripts and styles.
	dashboard, ui http.Handler
	// rest serves the REST paths, and answers every path nothing else takes.
	rest http.Handler
	// openapi serves the REST API's OpenAPI document (no key needed: it holds no secrets).
	openapi http.Handler
}

// newMux routes the server's requests: /healthz, /readyz, /metrics, /graphql, /graphiql,
// /openapi.json, the dashboard (GET / exactly, and its files under /ui/), and everything else to
// the REST handler at "/" (which has its own routes: see instrument).
func newMux(h handlers) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /readyz", h.ready)
	mux.Handle("GET /metrics", h.metrics)
	mux.Handle("/graphql", h.graphql)
	mux.Handle("GET /graphiql", h.graphiql)
	if h.dashboard != nil { // nil in tests of the other routes
		mux.Handle("GET /{$}", h.dashboard)
		mux.Handle("GET /ui/{asset}", h.ui)
	}
	mux.Handle("GET "+rest.OpenAPIPath, h.openapi)
	mux.Handle("/", h.rest)
	return mux
}

// rateLimit charges one request to p's rate limit: nil, or RATE_LIMITED. When Redis cannot
// answer, the request is allowed (the limiter fails open) and the failure is logged, once per
// cooldown rather than for every request.
func rateLimit(l *ratelimit.Limiter, log *slog.Logger) func(context.Context, auth.Principal) error {
	return func(ctx context.Context, p auth.Principal) error {
		d, err := l.Allow(ctx, p, 1)
		if err != nil && !errors.Is(err, ratelimit.ErrCooldown) && ctx.Err() == nil {
			log.Warn("rate limit: Redis did not answer; allowing requests until it does", "err", err)
		}
		return d.Err()
	}
}

func newLogger(cfg Config) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

// openRedis connects to REDIS_URL, or to the embedded Redis (local) when it is empty. It returns
// three clients on the same server: one for everything; one whose pool holds a connection per
// subscription for the subscribers' blocking reads, so that waiting subscribers never starve
// the rest; and one for the rate limiter, whose calls end at their context's deadline (the
// limiter gives each a short one and fails open) rather than at the client's read timeout.
func openRedis(ctx context.Context, url string, local *localredis.Server, maxSubs int) (rdb, blocking, limiter redis.UniversalClient, closeAll func(), err error) {
	var opts *redis.Options
	if local != nil {
		opts = local.ClientOptions()
	} else {
		opts, err = redis.ParseURL(url)
		if err != nil {
			return nil, nil, nil, nil, fmt.Errorf("REDIS_URL: %w", err)
		}
	}
	main := redis.NewClient(opts)
	bopts := *opts
	// Sandbox event subscriptions and exec output subscriptions are bounded by maxSubs each.
	bopts.PoolSize = 2*maxSubs + 16
	bopts.PoolTimeout = 2 * time.Second
	// A waiting subscriber reads a few small events at a time: small buffers, and idle
	// connections closed when the subscriptions end.
	bopts.ReadBufferSize = 4 << 10
	bopts.WriteBufferSize = 4 << 10
	bopts.MaxIdleConns = 32
	bopts.ConnMaxIdleTime = time.Minute
	// go-redis sizes the queue of its maintenance handoffs (a managed Redis moving a connection
	// to another endpoint) by the pool, and allocates it up front: 21 MB held from the start
	// with max_subscriptions 10,000. These connections hold blocking reads that the followers
	// already retry when one fails.
	bopts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	block := redis.NewClient(&bopts)
	lopts := *opts
	lopts.ContextTimeoutEnabled = true
	limit := redis.NewClient(&lopts)
	closeAll = func() {
		limit.Close()
		block.Close()
		main.Close()
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := main.Ping(pctx).Err(); err != nil {
		closeAll()
		return nil, nil, nil, nil, fmt.Errorf("redis at %s: %w", cmp.Or(source.RedactURL(url), "embedded: "+redisSocket(local)), err)
	}
	return main, block, limit, closeAll, nil
}

// redisSocket is the embedded Redis's socket, for logs.
func redisSocket(local *localredis.Server) string {
	if local == nil {
		return ""
	}
	return local.Socket()
}

func checkpointLocation(cfg Config) string {
	if cfg.Checkpoints.Store == "gcs" {
		return "gs://" + cfg.Checkpoints.GCSBucket + "/" + strings.Trim(cfg.Checkpoints.GCSPrefix, "/")
	}
	return cfg.CheckpointDir
}

// openCheckpointStore opens the configured object store for checkpoints.
func openCheckpointStore(ctx context.Context, cfg Config) (checkpoint.ObjectStore, func(), error) {
	if cfg.Checkpoints.Store == "gcs" {
		g, err := checkpoint.NewGCSStore(ctx, cfg.Checkpoints.GCSOptions())
		if err != nil {
			return nil, nil, err
		}
		return g, func() { g.Close() }, nil
	}
	l, err := checkpoint.NewLocalStore(cfg.CheckpointDir)
	if err != nil {
		return nil, nil, err
	}
	return l, func() {}, nil
}

// openDriver makes the configured runtime driver and checks that it can create boxes.
func openDriver(ctx context.Context, cfg Config, log *slog.Logger) (runtime.Driver, func(), error) {
	var d runtime.Driver
	closeFn := func() {}
	switch cfg.Runtime {
	case "kube":
		rc, err := kubeRESTConfig(cfg.Kube.Kubeconfig)
		if err != nil {
			return nil, nil, fmt.Errorf("kube runtime: %w", err)
		}
		kd, err := kube.New(ctx, cfg.Kube.Options(rc, log))
		if err != nil {
			return nil, nil, fmt.Errorf("kube runtime: %w", err)
		}
		d, closeFn = kd, func() { kd.Close() }
	default:
		gd, err := gvisor.New(gvisor.Options{Runsc: cfg.Runsc, StateDir: cfg.StateDir, InitBinary: cfg.InitBinary, SpawnerBinary: cfg.SpawnerBinary, Logger: log,
			LocalSubnet: cfg.Network.LocalSubnet})
		if err != nil {
			return nil, nil, fmt.Errorf("gvisor runtime: %w", err)
		}
		d, closeFn = gd, func() { gd.Close() }
	}
	if err := d.Check(ctx); err != nil {
		closeFn()
		return nil, nil, fmt.Errorf("%s runtime: %w", d.Name(), err)
	}
	return d, closeFn, nil
}

// kubeRESTConfig reads a kubeconfig file, or the in-cluster service account when path is empty.
func kubeRESTConfig(path string) (*kuberest.Config, error) {
	if path == "" {
		rc, err := kuberest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no kubeconfig given and not in a cluster: %w", err)
		}
		return rc, nil
	}
	return clientcmd.BuildConfigFromFlags("", path)
}

// poolerOf is the driver's side of warm pools, when it keeps them (the local driver; the kube
// driver, whose pools are the cluster's: runtime.SharedPooler).
func poolerOf(d runtime.Driver) runtime.Pooler {
	p, _ := d.(runtime.Pooler)
	return p
}

// lookupSource lists the runtime's boxes as lookup entries: what Redis is rebuilt from.
func lookupSource(d runtime.Driver) store.Source {
	return func(ctx context.Context) ([]store.Entry, error) {
		boxes, err := d.List(ctx)
		if err != nil {
			return nil, err
		}
		out := make([]store.Entry, 0, len(boxes))
		for _, b := range boxes {
			out = append(out, sandbox.EntryOf(b))
		}
		return out, nil
	}
}

func readyz(rdb redis.UniversalClient, d runtime.Driver) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		var problems []string
		if err := rdb.Ping(ctx).Err(); err != nil {
			problems = append(problems, "redis: "+err.Error())
		}
		if err := d.Check(ctx); err != nil {
			problems = append(problems, "runtime: "+err.Error())
		}
		w.Header().Set("Content-Type", "text/plain")
		if len(problems) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, strings.Join(problems, "\n"))
			fmt.Fprintln(w, versionDetail())
			return
		}
		fmt.Fprintln(w, "ready")
		fmt.Fprintln(w, versionDetail())
	}
}

// instrument records request latency by route: the pattern of the route that served the
// request (a bounded set, never an id). next is the server's mux, which sets the request's
// Pattern; the REST handler behind its "/" has routes of its own and notes the one it
// matched (rest.RecordRoute). Each request is also a server span named by that route
// (tracing.StartServer), in the trace of its traceparent header when it has one.
func instrument(next http.Handler, reg prometheus.Registerer) http.Handler {
	hist := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sandboxd_http_request_duration_seconds",
		Help:    "HTTP request latency by route, method and status code.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"route", "method", "code"})
	reg.MustRegister(hist)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		ctx, endSpan := tracing.StartServer(r)
		ctx, restRoute := rest.RecordRoute(ctx)
		r = r.WithContext(ctx)
		next.ServeHTTP(sw, r)
		pattern := restRoute()
		if pattern == "" {
			pattern = r.Pattern
		}
		hist.WithLabelValues(route(pattern), method(r.Method), fmt.Sprint(sw.code)).Observe(time.Since(start).Seconds())
		endSpan(route(pattern), sw.code)
	})
}

// route is the label of a ServeMux pattern ("[METHOD ][HOST]/PATH"): its path, with the
// wildcards as they are ("/sandbox/sandboxes/v1/{id}"). No pattern, or a catch-all (a path
// that ends in "/": the REST handler at "/" when no REST route took the request), is "other".
func route(pattern string) string {
	if i := strings.IndexAny(pattern, " \t"); i >= 0 {
		pattern = strings.TrimLeft(pattern[i:], " \t")
	}
	if i := strings.IndexByte(pattern, '/'); i > 0 {
		pattern = pattern[i:]
	}
	if !strings.HasPrefix(pattern, "/") || strings.HasSuffix(pattern, "/") {
		return "other"
	}
	return pattern
}

func method(m string) string {
	switch m {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodHead, http.MethodOptions:
		return m
	}
	return "other"
}

type statusWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.code, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach Flush and Hijack (SSE, WebSocket).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush implements http.Flusher (SSE needs it).
func (w *statusWriter) Flush() {
	w.wrote = true
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Hijack implements http.Hijacker (WebSocket upgrades need it).
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, fmt.Errorf("hijack: %T is not a Hijacker", w.ResponseWriter)
	}
	w.wrote = true
	if w.code == http.StatusOK {
		w.code = http.StatusSwitchingProtocols
	}
	return h.Hijack()
}
