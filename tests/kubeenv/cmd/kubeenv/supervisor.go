package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sandboxd/tests/kubeenv/internal/runc"
	"sandboxd/tests/kubeenv/internal/runsc"
)

// supervisor runs the cluster's programs.
type supervisor struct {
	cfg      config
	start    time.Time
	children []*child
	// runsc is the CLI over the node's runsc root, with the node's global flags.
	runsc *runsc.CLI
	// runc is the CLI over the node's runc root (nil when the node runs no runc).
	runc *runc.CLI
}

func (s *supervisor) path(parts ...string) string {
	return filepath.Join(append([]string{s.cfg.dir}, parts...)...)
}

func (s *supervisor) run() error {
	c := s.cfg
	s.runsc = &runsc.CLI{
		Path:  c.runscPath,
		Root:  runsc.RootFor(s.path("node")),
		Flags: []string{"--platform=" + c.platform, "--network=none", "--overlay2=root:memory"},
	}
	if c.runcRuntimeClass != "" {
		node := s.path("node")
		s.runc = &runc.CLI{Path: c.runcPath, Root: runc.RootFor(node), CgroupParent: runc.CgroupParentFor(node)}
	}
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)

	if err := s.prepareDir(); err != nil {
		return err
	}
	f, err := s.writePKI()
	if err != nil {
		return err
	}
	logf("pki and kubeconfigs written in %d ms", time.Since(s.start).Milliseconds())

	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	go func() {
		select {
		case got := <-sig:
			logf("%v during start-up: stopping", got)
			cancel()
		case <-ctx.Done():
		}
	}()

	if err := s.startControlPlane(ctx, f); err != nil {
		s.stopAll()
		return err
	}
	if err := s.startNodeAndControllers(ctx, f); err != nil {
		s.stopAll()
		return err
	}
	cancel()
	if err := s.writeReady(f); err != nil {
		s.stopAll()
		return err
	}
	took := time.Since(s.start)
	logf("cluster ready in %.1f s", took.Seconds())
	fmt.Printf("KUBECONFIG=%s\n", f.adminKubeconfig)
	fmt.Printf("kubeenv: cluster ready in %.1f s: server %s, node %s, storage class %s, logs %s, env %s\n",
		took.Seconds(), f.server, c.nodeName, c.storageClass, s.path("logs"), s.path("env"))

	// Run until a signal or until a child exits on its own.
	exited := make(chan *child, len(s.children))
	for _, ch := range s.children {
		go func() { <-ch.done; exited <- ch }()
	}
	select {
	case got := <-sig:
		logf("%v: stopping the cluster", got)
		s.stopAll()
		logf("stopped")
		return nil
	case ch := <-exited:
		s.reportExit(ch)
		s.stopAll()
		return fmt.Errorf("%s exited unexpectedly", ch.name)
	}
}

// prepareDir empties what an earlier up left in the folder (after removing its runsc
// containers, whose state lives there) and makes the folders.
func (s *supervisor) prepareDir() error {
	if err := os.MkdirAll(s.cfg.dir, 0o755); err != nil {
		return err
	}
	if pid := readPid(s.path("pid")); pid > 0 && pid != os.Getpid() && isSupervisor(pid) {
		return fmt.Errorf("a kubeenv supervisor (pid %d) still runs on %s: run `kubeenv down --dir %s` first", pid, s.cfg.dir, s.cfg.dir)
	}
	if ids, err := s.runsc.DestroyAll(context.Background()); err != nil {
		return fmt.Errorf("remove runsc containers an earlier cluster left: %w", err)
	} else if len(ids) > 0 {
		logf("removed %d runsc containers an earlier cluster left", len(ids))
	}
	if err := s.destroyRunc(context.Background(), "an earlier cluster left"); err != nil {
		return err
	}
	for _, name := range []string{"ready", "env", "pid", "admin.kubeconfig", "admin.token", "pki", "etcd", "node", "logs"} {
		if err := os.RemoveAll(s.path(name)); err != nil {
			return fmt.Errorf("clean %s: %w", s.path(name), err)
		}
	}
	for _, d := range []string{"logs", "node", "etcd"} {
		if err := os.MkdirAll(s.path(d), 0o700); err != nil {
			return err
		}
	}
	return os.WriteFile(s.path("pid"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
}

// spawn starts a program of the bin folder as a child.
func (s *supervisor) spawn(name string, deathSig syscall.Signal, args ...string) (*child, error) {
	ch, err := startChild(name, filepath.Join(s.cfg.bin, name), s.path("logs"), deathSig, args...)
	if err != nil {
		return nil, err
	}
	s.children = append(s.children, ch)
	logf("%s started (pid %d, log %s)", name, ch.pid(), ch.logPath)
	return ch, nil
}

// startupPoll is the retry interval of start-up checks of endpoints that cannot be watched.
const startupPoll = 50 * time.Millisecond

// waitFor retries check until it succeeds, failing early when one of the children exits.
func (s *supervisor) waitFor(ctx context.Context, what string, children []*child, check func(context.Context) error) error {
	var last error
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		last = check(cctx)
		cancel()
		if last == nil {
			return nil
		}
		if err := s.checkChildren(children, what); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), last)
		case <-time.After(startupPoll):
		}
	}
}

// watchUntil runs a watch-based wait, restarting it when the watch ends, failing early
// when one of the children exits.
func (s *supervisor) watchUntil(ctx context.Context, children []*child, what string, wait func(context.Context) (bool, error)) error {
	for {
		wctx, cancel := context.WithCancel(ctx)
		stopOnExit := make(chan struct{})
		go func() {
			defer close(stopOnExit)
			cases := make([]<-chan struct{}, 0, len(children))
			for _, ch := range children {
				cases = append(cases, ch.done)
			}
			waitAny(wctx, cases)
			cancel()
		}()
		ok, err := wait(wctx)
		cancel()
		<-stopOnExit
		if ok {
			return nil
		}
		if cerr := s.checkChildren(children, what); cerr != nil {
			return cerr
		}
		if ctx.Err() != nil {
			return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), err)
		}
		if err != nil {
			time.Sleep(startupPoll)
		}
	}
}

// waitAny returns when ctx ends or one of the channels is closed.
func waitAny(ctx context.Context, chs []<-chan struct{}) {
	done := make(chan struct{}, len(chs))
	for _, ch := range chs {
		go func() {
			select {
			case <-ch:
				done <- struct{}{}
			case <-ctx.Done():
			}
		}()
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// checkChildren fails when one of the children has exited.
func (s *supervisor) checkChildren(children []*child, what string) error {
	for _, ch := range children {
		if ch.exited() {
			s.reportExit(ch)
			return fmt.Errorf("%s exited while waiting for %s", ch.name, what)
		}
	}
	return nil
}

// reportExit prints why a child exited and the tail of its log.
func (s *supervisor) reportExit(ch *child) {
	logf("%s (pid %d) exited: %v; last lines of %s:\n%s", ch.name, ch.pid(), ch.err, ch.logPath, ch.tail(3000))
}

// writeReady writes DIR/env and then DIR/ready.
func (s *supervisor) writeReady(f *files) error {
	token, err := os.ReadFile(f.adminToken)
	if err != nil {
		return err
	}
	vars := []struct{ k, v string }{
		{"KUBECONFIG", f.adminKubeconfig},
		{"KUBEENV_DIR", s.cfg.dir},
		{"KUBEENV_SERVER", f.server},
		{"KUBEENV_CA", f.ca},
		{"KUBEENV_TOKEN", strings.TrimSpace(string(token))},
		{"KUBEENV_NODE", s.cfg.nodeName},
		{"KUBEENV_STORAGE_CLASS", s.cfg.storageClass},
		{"KUBEENV_PID", strconv.Itoa(os.Getpid())},
	}
	var b strings.Builder
	b.WriteString("# kubeenv cluster environment: source it (sh), or read the KEY=VALUE lines\n")
	names := make([]string, 0, len(vars))
	for _, kv := range vars {
		fmt.Fprintf(&b, "%s=%s\n", kv.k, shellQuote(kv.v))
		names = append(names, kv.k)
	}
	fmt.Fprintf(&b, "export %s\n", strings.Join(names, " "))
	if err := writeAtomic(s.path("env"), []byte(b.String())); err != nil {
		return err
	}
	return writeAtomic(s.path("ready"), []byte(time.Now().Format(time.RFC3339Nano)+"\n"))
}

// stopAll stops the children by pid: the node first (it deletes its runsc containers),
// then the scheduler and controller manager, the API server and etcd. Then it removes any
// runsc container left in the node's root.
func (s *supervisor) stopAll() {
	_ = os.Remove(s.path("ready"))
	order := []string{"vknode", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"}
	for _, name := range order {
		for _, ch := range s.children {
			if ch.name == name {
				ch.stop(stopGrace)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if ids, err := s.runsc.DestroyAll(ctx); err != nil {
		logf("removing runsc containers left by the node: %v", err)
	} else if len(ids) > 0 {
		logf("removed %d runsc containers the node left", len(ids))
	}
	if err := s.destroyRunc(ctx, "the node left"); err != nil {
		logf("%v", err)
	}
	if !strings.HasPrefix(s.runsc.Root, s.cfg.dir+"/") {
		// The short runsc root outside the folder (see runsc.RootFor): remove it once empty
		// of containers.
		if ids, err := s.runsc.IDs(); err == nil && len(ids) == 0 {
			_ = os.RemoveAll(s.runsc.Root)
		}
	}
	_ = os.Remove(s.path("pid"))
}

// destroyRunc removes the runc containers in the node's runc root (their cgroups and
// overlay roots) and unmounts whatever is still mounted in the pods' folders.
func (s *supervisor) destroyRunc(ctx context.Context, who string) error {
	if s.runc != nil {
		if ids, err := s.runc.DestroyAll(ctx); err != nil {
			return fmt.Errorf("remove runc containers %s: %w", who, err)
		} else if len(ids) > 0 {
			logf("removed %d runc containers %s", len(ids), who)
		}
	}
	if err := runc.UnmountUnder(s.path("node", "pods")); err != nil {
		return fmt.Errorf("unmount what %s in %s: %w", who, s.path("node", "pods"), err)
	}
	return nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
