// Command sandbox-bench measures sandboxd against the bare runtime under it, side by side in one
// run, so that the machine's noise hits both alike: every group alternates its paths (ours
// through sandboxd's APIs, and the bare runsc or tar/zstd counterpart) iteration by iteration
// and reports medians, p99 and the ratio ours/bare.
//
// It starts its own sandboxd (the binaries that scripts/build.sh, scripts/ensure-runsc.sh and
// scripts/ensure-rootfs.sh make; it builds nothing) on a free loopback port with a temporary
// state folder and a generated development key, or targets a running one with --url and --key
// (the bare rows then need --state-dir, the server's state folder, and are skipped without it).
// It needs root, like runsc. Progress goes to stderr, the table (Markdown, or JSON with --json)
// to stdout. Every sandbox it makes is destroyed, the sandboxd it started is stopped and its
// temporary folder removed.
//
// Besides the side-by-side groups, the reads suite loads REST reads with N concurrent clients
// next to /healthz, the quota suite times internal/quota against a redis-server of its own,
// and the memory and subscriptions suites measure what idle sandboxes and idle subscriptions
// cost the host and sandboxd.
//
//	sudo go run ./cmd/sandbox-bench [--only exec,create,warm,stopstart,pause,stream,reads,quota,memory,subscriptions] [--exec-n 100] [--stream-mb 32] [--json]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

type options struct {
	url, key, stateDir               string
	sandboxd, runsc, initBin, rootfs string
	tmpDir                           string
	json, keep                       bool
	// warmProfile: the server gets the warm suite's profile (set from the selected suites).
	warmProfile                       bool
	only                              string
	warmup, execN, createN, stopStart int
	workspaceMB, workspaceFiles       int
	readsClients                      string
	readsDuration                     time.Duration
	readsRounds                       int
	quotaN, quotaConc                 int
	memoryK                           int
	memorySettle                      time.Duration
	subs                              int
	subsWait                          time.Duration
	streamMB, streamN, firstByteN     int
	warmN, warmPool                   int
	vsSandboxd, vsInit, vsRootfs      string
	vsCommand                         string
	vsRounds                          int
	vsIdle                            time.Duration
	vsFirstByte                       bool
}

// suite is one family of groups. Adding a row to the benchmark is adding a suite here (or a
// group to one): it gets the bench (API client, state folder, runsc, temp folder, sandbox
// tracking) and returns its finished groups.
type suite struct {
	name string
	run  func(ctx context.Context, b *bench) ([]*Group, error)
	// optIn: the suite runs only when --only names it.
	optIn bool
}

var suites = []suite{
	{name: "exec", run: benchExec},
	{name: "create", run: benchCreate},
	{name: "warm", run: benchWarm},
	{name: "network", run: benchNetwork},
	{name: "stopstart", run: benchStopStart},
	{name: "pause", run: benchPause},
	{name: "stream", run: benchStream},
	{name: "reads", run: benchReads},
	{name: "quota", run: benchQuota},
	{name: "memory", run: benchMemory},
	{name: "subscriptions", run: benchSubscriptions},
	{name: "vs", run: benchVs, optIn: true},
}

// suiteNames lists the suites, for the usage and errors.
func suiteNames() string {
	names := make([]string, len(suites))
	for i, s := range suites {
		names[i] = s.name
	}
	return strings.Join(names, ", ")
}

func main() {
	os.Exit(run())
}

func parseFlags() *options {
	o := &options{}
	cache := cacheDir()
	flag.StringVar(&o.url, "url", "", "target this running sandboxd instead of starting one (needs --key)")
	flag.StringVar(&o.key, "key", os.Getenv("SANDBOX_API_KEY"), "API key for --url (default $SANDBOX_API_KEY)")
	flag.StringVar(&o.stateDir, "state-dir", "", "with --url: the server's state folder (runsc --root, workspaces); the bare rows are skipped without it")
	flag.StringVar(&o.sandboxd, "sandboxd", filepath.Join(cache, "bin", "sandboxd"), "sandboxd binary (scripts/build.sh)")
	flag.StringVar(&o.initBin, "init-binary", defaultInit(), "sandbox-init binary (scripts/build.sh)")
	flag.StringVar(&o.runsc, "runsc", defaultRunsc(), "runsc binary (scripts/ensure-runsc.sh)")
	flag.StringVar(&o.rootfs, "rootfs", defaultRootfs(), "base rootfs of the default profile (scripts/ensure-rootfs.sh)")
	flag.StringVar(&o.tmpDir, "tmp-dir", os.TempDir(), "where the run's temporary folder goes (state, checkpoints, tar files)")
	flag.BoolVar(&o.json, "json", false, "print JSON instead of a Markdown table")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary folder (server log, state) for inspection")
	flag.StringVar(&o.only, "only", "", "comma-separated suites to run ("+suiteNames()+"); default all but vs")
	flag.IntVar(&o.warmup, "warmup", 3, "unrecorded warm-up rounds of the exec and create groups")
	flag.IntVar(&o.execN, "exec-n", 30, "recorded rounds of each exec group")
	flag.IntVar(&o.createN, "create-n", 6, "recorded rounds of create → first exec")
	flag.IntVar(&o.stopStart, "stopstart-n", 3, "recorded stop/start rounds of the 100 MB workspace")
	flag.IntVar(&o.workspaceMB, "workspace-mb", 100, "size of the stop/start workspace in MB")
	flag.IntVar(&o.workspaceFiles, "workspace-files", 6000, "number of files of the stop/start workspace")
	flag.StringVar(&o.readsClients, "reads-clients", "1,8,32", "comma-separated numbers of concurrent clients of the reads suite")
	flag.DurationVar(&o.readsDuration, "reads-duration", 3*time.Second, "how long each read path is loaded at each client count")
	flag.IntVar(&o.readsRounds, "reads-rounds", 3, "slices the reads duration is split into, alternating the paths")
	flag.IntVar(&o.quotaN, "quota-n", 300, "recorded serial acquire/release pairs (and SET/DEL pairs)")
	flag.IntVar(&o.quotaConc, "quota-concurrency", 20, "goroutines of the concurrent quota group")
	flag.IntVar(&o.memoryK, "memory-k", 5, "idle sandboxes of the memory suite (at most the concurrency limit, 10 by default)")
	flag.DurationVar(&o.memorySettle, "memory-settle", 10*time.Second, "how long the idle sandboxes settle before they are measured")
	flag.IntVar(&o.subs, "subscriptions", 1000, "idle sandboxEvents subscriptions of the subscriptions suite (one per WebSocket)")
	flag.DurationVar(&o.subsWait, "subscriptions-wait", 15*time.Second, "how long the subscriptions stay idle before they are measured")
	flag.IntVar(&o.streamMB, "stream-mb", 32, "MiB of stdout of the stream throughput group (below 64: the guest keeps at most 64 MiB of an exec's output log, record headers included)")
	flag.IntVar(&o.streamN, "stream-n", 10, "recorded rounds of the stream throughput group (after one warm-up round, none with --warmup 0)")
	flag.IntVar(&o.firstByteN, "first-byte-n", 30, "recorded rounds of the first-byte-of-stdout group")
	flag.IntVar(&o.warmN, "warm-n", 20, "recorded rounds of the warm suite (warm and cold create → first exec)")
	flag.IntVar(&o.warmPool, "warm-pool", 1, "warm_pool of the warm suite's profile")
	flag.StringVar(&o.vsSandboxd, "vs-sandboxd", "", "the vs suite's second server: its sandboxd binary (default --sandboxd)")
	flag.StringVar(&o.vsInit, "vs-init-binary", "", "the vs suite's second server: its sandbox-init binary (default --init-binary)")
	flag.StringVar(&o.vsRootfs, "vs-rootfs", "", "the vs suite's second server: its base rootfs (default --rootfs)")
	flag.StringVar(&o.vsCommand, "vs-command", "true", "the vs suite's command, split at spaces (no shell)")
	flag.IntVar(&o.vsRounds, "vs-rounds", 20, "alternating rounds of the vs suite (each of --exec-n execs per server)")
	flag.BoolVar(&o.vsFirstByte, "vs-first-byte", false, "the vs suite times each exec through REST SSE to its first stdout bytes instead of a waited exec to its answer (the command must write to stdout)")
	flag.DurationVar(&o.vsIdle, "vs-idle", 0, "the vs suite waits this long, untimed, before each exec (an agent's pace: read caches lapsed, threads asleep); 0: back to back")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: sandbox-bench [flags]   (as root)\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	return o
}

func run() int {
	o := parseFlags()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "sandbox-bench: unexpected arguments %v\n", flag.Args())
		return 2
	}
	selected, err := selectSuites(o.only)
	if err == nil {
		_, err = parseClients(o.readsClients)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-bench:", err)
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "sandbox-bench: needs root (runsc does): run it with sudo")
		return 2
	}
	// The server gets the warm suite's profile (and boots its pool) only when the suite runs.
	o.warmProfile = slices.ContainsFunc(selected, func(s suite) bool { return s.name == "warm" })
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	b, err := setup(ctx, o)
	if b != nil {
		defer b.cleanup()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-bench:", err)
		return 1
	}
	report := &Report{Date: time.Now(), Machine: machineInfo(o.runsc, b.tmp), Target: b.target}
	loadStart := loadAvg()
	for _, s := range selected {
		if ctx.Err() != nil {
			report.Errors = append(report.Errors, "interrupted")
			break
		}
		progress("== %s", s.name)
		groups, err := s.run(ctx, b)
		for _, g := range groups {
			g.finish()
		}
		report.Groups = append(report.Groups, groups...)
		if err != nil {
			progress("%s failed: %v", s.name, err)
			report.Errors = append(report.Errors, fmt.Sprintf("%s: %v", s.name, err))
		}
	}
	if b.server != nil && ctx.Err() == nil {
		var ran []string
		for _, s := range selected {
			ran = append(ran, s.name)
		}
		g := serverMemory(ctx, b, ran)
		g.finish()
		report.Groups = append(report.Groups, g)
	}
	report.Machine.RunscFlags = b.flagsShown
	if loadEnd := loadAvg(); loadStart != "" && loadEnd != "" {
		report.Machine.LoadAvg = loadStart + " → " + loadEnd
	}
	b.cleanup()
	if o.json {
		err = writeJSON(os.Stdout, report)
	} else {
		err = writeMarkdown(os.Stdout, report)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-bench:", err)
		return 1
	}
	if len(report.Errors) > 0 || len(b.cleanupErrs) > 0 {
		return 1
	}
	return 0
}

func selectSuites(only string) ([]suite, error) {
	if only == "" {
		var all []suite
		for _, s := range suites {
			if !s.optIn {
				all = append(all, s)
			}
		}
		return all, nil
	}
	var out []suite
	for name := range strings.SplitSeq(only, ",") {
		name = strings.TrimSpace(name)
		found := false
		for _, s := range suites {
			if s.name == name {
				out = append(out, s)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown suite %q (have %s)", name, suiteNames())
		}
	}
	return out, nil
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[bench %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// bench is what every suite works with.
type bench struct {
	opts *options
	api  *client
	// stateDir is sandboxd's state folder; "" when unknown (the bare rows are then skipped).
	stateDir string
	runsc    string
	// tmp is this run's temporary folder.
	tmp    string
	target string
	server *server
	// flagsShown are the global runsc flags of the sandboxes, for the report.
	flagsShown string

	mu        sync.Mutex
	sandboxes map[string]bool
	// raw are the containers made with bare runsc, by bundle.
	raw map[*rawBundle]map[string]bool

	cleanOnce   sync.Once
	cleanupErrs []string

	// cpu is where cpuSnapshot reads.
	cpu cpuSources
}

// setup checks the components and starts sandboxd (or connects to --url).
func setup(ctx context.Context, o *options) (*bench, error) {
	if err := checkFile("runsc", o.runsc, "scripts/ensure-runsc.sh"); err != nil {
		if o.url == "" || o.stateDir != "" {
			return nil, err
		}
		o.runsc = ""
	}
	tmp, err := os.MkdirTemp(o.tmpDir, "sandbox-bench-")
	if err != nil {
		return nil, err
	}
	b := &bench{opts: o, runsc: o.runsc, tmp: tmp, sandboxes: map[string]bool{}, raw: map[*rawBundle]map[string]bool{}}
	if o.url != "" {
		if o.key == "" {
			return b, errors.New("--url needs --key (or SANDBOX_API_KEY)")
		}
		b.api = newClient(o.url, o.key)
		b.stateDir = o.stateDir
		b.target = "running server at " + o.url
		if b.stateDir == "" {
			progress("no --state-dir: the bare rows are skipped")
		}
		return b, nil
	}
	for _, c := range []struct{ what, path, script string }{
		{"sandboxd", o.sandboxd, "scripts/build.sh"},
		{"sandbox-init", o.initBin, "scripts/build.sh"},
		{"rootfs", o.rootfs, "scripts/ensure-rootfs.sh"},
	} {
		if err := checkFile(c.what, c.path, c.script); err != nil {
			return b, err
		}
	}
	s, err := startServer(ctx, o, tmp)
	if s != nil {
		b.server = s
	}
	if err != nil {
		return b, err
	}
	b.api = newClient(s.url, s.key)
	b.stateDir = s.stateDir
	b.target = "started by the benchmark (embedded Redis, default profile)"
	return b, nil
}

// createSandbox creates a sandbox through REST and tracks it for destruction.
func (b *bench) createSandbox(ctx context.Context) (string, time.Duration, error) {
	return b.createSandboxFrom(ctx, "")
}

// createSandboxFrom is createSandbox with the workspace restored from snapshot snapID ("":
// an empty workspace); the duration is the create call's, restore included.
func (b *bench) createSandboxFrom(ctx context.Context, snapID string) (string, time.Duration, error) {
	t0 := time.Now()
	sb, err := b.api.create(ctx, snapID)
	d := time.Since(t0)
	b.track(sb.ID)
	return sb.ID, d, err
}

// track notes a sandbox the run made ("" for none), which the cleanup destroys when nothing
// else did.
func (b *bench) track(id string) {
	if id == "" {
		return
	}
	b.mu.Lock()
	b.sandboxes[id] = true
	b.mu.Unlock()
}

// destroySandbox destroys a tracked sandbox.
func (b *bench) destroySandbox(ctx context.Context, id string) error {
	if err := b.api.destroy(ctx, id); err != nil {
		return fmt.Errorf("destroying %s: %w", id, err)
	}
	b.mu.Lock()
	delete(b.sandboxes, id)
	b.mu.Unlock()
	return nil
}

// stopServer stops a server the run started and deletes what it left in its runsc root (a
// sandbox that was not destroyed). It returns what went wrong, one message each.
func (b *bench) stopServer(ctx context.Context, s *server) []string {
	var msgs []string
	if err := s.stop(); err != nil {
		msgs = append(msgs, fmt.Sprintf("sandboxd exited with %v after SIGTERM (log: %s)", err, s.logPath))
	}
	if b.runsc == "" {
		return msgs
	}
	left, err := leftoverContainers(b.runsc, runscRoot(s.stateDir))
	if err != nil {
		msgs = append(msgs, err.Error())
	}
	for _, id := range left {
		msgs = append(msgs, fmt.Sprintf("runsc container %s was left behind: deleting it", id))
		_ = b.runscRun(ctx, []string{"--root=" + runscRoot(s.stateDir)}, "delete", "-force", id)
		removeCgroups(id)
	}
	return msgs
}

// cleanup destroys what the run made, stops the sandboxd it started and removes the
// temporary folder. It runs once; errors are reported on stderr and in the exit code.
func (b *bench) cleanup() {
	b.cleanOnce.Do(func() {
		fail := func(format string, args ...any) {
			msg := fmt.Sprintf(format, args...)
			progress("cleanup: %s", msg)
			b.cleanupErrs = append(b.cleanupErrs, msg)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		b.mu.Lock()
		var ids []string
		for id := range b.sandboxes {
			ids = append(ids, id)
		}
		b.mu.Unlock()
		if b.api != nil {
			for _, id := range ids {
				if err := b.destroySandbox(ctx, id); err != nil {
					fail("%v", err)
				}
			}
		}
		for r, ids := range b.raw {
			for id := range ids {
				if err := b.deleteRaw(r, id); err != nil {
					fail("%v", err)
				}
			}
		}
		if b.server != nil {
			for _, msg := range b.stopServer(ctx, b.server) {
				fail("%s", msg)
			}
		}
		if !unmountUnder(b.tmp) {
			fail("mounts left under %s: not removing it", b.tmp)
			return
		}
		if b.opts.keep || (len(b.cleanupErrs) > 0 && b.server != nil) {
			progress("kept %s", b.tmp)
			return
		}
		if err := os.RemoveAll(b.tmp); err != nil {
			fail("removing %s: %v", b.tmp, err)
		}
	})
}

// step is one timed operation of a round. It times itself, so that set-up and clean-up around
// the timed part stay out of the sample.
type step struct {
	res *Result
	run func(ctx context.Context) (time.Duration, error)
}

// interleave runs warmup unrecorded rounds and then n recorded rounds of steps. Each round runs
// every step once, starting one step further than the round before, so that no path always
// runs first (or always right after another).
func interleave(ctx context.Context, name string, warmup, n int, steps []step) error {
	return interleaveOrdered(ctx, name, warmup, n, steps, func(round int) []int {
		order := make([]int, len(steps))
		for k := range order {
			order[k] = (round + k) % len(steps)
		}
		return order
	})
}

// interleaveOrdered is interleave with the order of each round's steps (indexes into steps)
// given by order, for steps that depend on one another.
func interleaveOrdered(ctx context.Context, name string, warmup, n int, steps []step, order func(round int) []int) error {
	progress("%s: %d warm-up + %d rounds of %d paths", name, warmup, n, len(steps))
	lastReport := time.Now()
	for round := 0; round < warmup+n; round++ {
		for _, k := range order(round) {
			if err := ctx.Err(); err != nil {
				return err
			}
			s := steps[k]
			d, err := s.run(ctx)
			if err != nil {
				return fmt.Errorf("%s, %s: %w", name, s.res.Label, err)
			}
			if round >= warmup {
				s.res.add(d)
			}
		}
		if time.Since(lastReport) > 5*time.Second {
			progress("%s: %d/%d rounds", name, round+1, warmup+n)
			lastReport = time.Now()
		}
	}
	var parts []string
	for _, s := range steps {
		parts = append(parts, fmt.Sprintf("%s %s", s.res.Label, fmtDuration(summarize(s.res.Samples).Median)))
	}
	progress("%s: medians: %s", name, strings.Join(parts, ", "))
	return nil
}

// timed runs f and returns how long it took.
func timed(f func() error) (time.Duration, error) {
	t0 := time.Now()
	err := f()
	return time.Since(t0), err
}
