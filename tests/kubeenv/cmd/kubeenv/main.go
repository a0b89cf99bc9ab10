// Command kubeenv runs a real, local Kubernetes cluster for tests, in the foreground:
// embedded etcd, kube-apiserver, kube-controller-manager, kube-scheduler and a
// virtual-kubelet node (vknode) whose pods are real gVisor containers, all on 127.0.0.1.
//
//	kubeenv up --dir DIR --runsc PATH [--bin BINDIR] --image NAME=ROOTFS [--image ...] [flags]
//	kubeenv down --dir DIR
//
// `up` makes a fresh cluster in DIR (it replaces what an earlier `up` left there):
//
//	DIR/pki/                 CA, certificates, keys, service account keys, token file
//	DIR/admin.kubeconfig     cluster-admin (client certificate in system:masters)
//	DIR/admin.token          a bearer token in system:masters (same rights)
//	DIR/etcd/                etcd's data
//	DIR/node/                the node's runsc root, pod folders and provisioned volumes (pv/)
//	DIR/logs/<name>.log      each program's output (kept after exit)
//	DIR/env                  shell variables: KUBECONFIG=..., KUBEENV_SERVER=..., KUBEENV_PID=...
//	DIR/pid                  the supervisor's pid
//	DIR/ready                written last, once the cluster is ready (removed on exit)
//
// Once ready it prints "KUBECONFIG=DIR/admin.kubeconfig" (and a summary) on stdout; progress
// goes to stderr. On SIGTERM or SIGINT it stops every child by its pid (SIGTERM, SIGKILL
// after 5 s; the node first, so it deletes its runsc containers), removes any runsc
// container left in DIR/node and exits 0. If a child exits on its own it prints the tail of
// its log and exits 1. `down` sends SIGTERM to the supervisor whose pid DIR/pid holds and
// waits for it to exit.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"sandboxd/tests/kubeenv/internal/provisioner"
	"sandboxd/tests/kubeenv/internal/runsc"
)

func init() {
	// Children are started from the main goroutine, which stays on the main thread: their
	// parent-death signal (Pdeathsig) follows the thread that forked them, and the main
	// thread lives as long as the process.
	goruntime.LockOSThread()
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "up":
		err = up(os.Args[2:])
	case "down":
		err = down(os.Args[2:])
	case "-h", "--help", "help":
		usage()
	default:
		usage()
	}
	if err != nil {
		logf("error: %v", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage:\n  kubeenv up --dir DIR --runsc PATH [--bin BINDIR] --image NAME=ROOTFS ... [flags]\n  kubeenv down --dir DIR\nrun `kubeenv up -h` for the flags\n")
	os.Exit(2)
}

// logf prints a progress line on stderr.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[kubeenv %s] %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// config is what `up` was asked for.
type config struct {
	dir, bin, runscPath, platform string
	images                        multiFlag
	nodeName, storageClass        string
	runtimeClass                  string
	apiserverPort, etcdPort       int
	etcdPeerPort, kubeletPort     int
	cmPort, schedulerPort         int
	verbosity                     int
	timeout                       time.Duration
}

// programs are the binaries `up` needs in --bin.
var programs = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "vknode"}

func up(args []string) error {
	var c config
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	fs.StringVar(&c.dir, "dir", "", "the cluster's folder (required; what an earlier up left there is replaced)")
	fs.StringVar(&c.bin, "bin", "", "folder of the binaries: "+strings.Join(programs, ", ")+" (default: kubeenv's own folder)")
	fs.StringVar(&c.runscPath, "runsc", "", "runsc binary (required)")
	fs.StringVar(&c.platform, "platform", "systrap", "runsc --platform")
	fs.Var(&c.images, "image", "NAME=ROOTFS: the node runs image NAME from the rootfs folder ROOTFS (repeatable)")
	fs.StringVar(&c.nodeName, "node-name", "sandbox-node", "name of the node")
	fs.StringVar(&c.storageClass, "storage-class", "sandbox-local", "StorageClass created as the default class, served by the node's hostPath provisioner")
	fs.StringVar(&c.runtimeClass, "runtime-class", "", "also create a RuntimeClass of this name with handler runsc (default: none)")
	fs.IntVar(&c.apiserverPort, "apiserver-port", 16443, "kube-apiserver port on 127.0.0.1")
	fs.IntVar(&c.etcdPort, "etcd-port", 12379, "etcd client port")
	fs.IntVar(&c.etcdPeerPort, "etcd-peer-port", 12380, "etcd peer port")
	fs.IntVar(&c.kubeletPort, "kubelet-port", 16250, "the node's kubelet API port")
	fs.IntVar(&c.cmPort, "controller-manager-port", 16257, "kube-controller-manager secure port")
	fs.IntVar(&c.schedulerPort, "scheduler-port", 16259, "kube-scheduler secure port")
	fs.IntVar(&c.verbosity, "v", 0, "log verbosity of the Kubernetes programs")
	fs.DurationVar(&c.timeout, "timeout", 90*time.Second, "how long the cluster may take to become ready")
	_ = fs.Parse(args)
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if c.dir == "" || c.runscPath == "" {
		return errors.New("--dir and --runsc are required")
	}
	var err error
	if c.dir, err = filepath.Abs(c.dir); err != nil {
		return err
	}
	if c.bin == "" {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		c.bin = filepath.Dir(self)
	}
	for _, p := range programs {
		if fi, err := os.Stat(filepath.Join(c.bin, p)); err != nil || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is missing in %s (build them with scripts/ensure-kubeenv.sh)", p, c.bin)
		}
	}
	if _, err := os.Stat(c.runscPath); err != nil {
		return fmt.Errorf("--runsc: %w", err)
	}
	for _, kv := range c.images {
		name, dir, ok := strings.Cut(kv, "=")
		if !ok || name == "" || dir == "" {
			return fmt.Errorf("--image %q: want NAME=ROOTFS", kv)
		}
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return fmt.Errorf("--image %s: %s is not a folder", name, dir)
		}
	}
	for _, port := range []int{c.apiserverPort, c.etcdPort, c.etcdPeerPort, c.kubeletPort, c.cmPort, c.schedulerPort} {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return fmt.Errorf("port %d on 127.0.0.1 is not free (another cluster running? see the --*-port flags): %w", port, err)
		}
		l.Close()
	}
	s := &supervisor{cfg: c, start: time.Now()}
	return s.run()
}

// supervisor runs the cluster's programs.
type supervisor struct {
	cfg      config
	start    time.Time
	children []*child
	// runsc is the CLI over the node's runsc root, with the node's global flags.
	runsc *runsc.CLI
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

// files are the paths `up` generated.
type files struct {
	server                                      string
	ca, caKey, saKey, saPub, tokens             string
	apiserver, kubeletClient, nodeServing       issued
	cmServing, schedServing                     issued
	adminKubeconfig, cmKubeconfig               string
	schedKubeconfig, nodeKubeconfig, adminToken string
}

// writePKI generates the cluster's PKI, token file and kubeconfigs.
func (s *supervisor) writePKI() (*files, error) {
	c := s.cfg
	p, err := newPKI(s.path("pki"))
	if err != nil {
		return nil, err
	}
	f := &files{server: fmt.Sprintf("https://127.0.0.1:%d", c.apiserverPort), ca: p.path("ca.crt"), caKey: p.path("ca.key")}
	loopback := []net.IP{net.ParseIP("127.0.0.1")}
	if f.apiserver, err = p.issue("apiserver", certSpec{
		cn: "kube-apiserver", server: true,
		dns: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		ips: append(loopback, net.ParseIP("10.96.0.1")),
	}); err != nil {
		return nil, err
	}
	if f.kubeletClient, err = p.issue("apiserver-kubelet-client", certSpec{cn: "kube-apiserver-kubelet-client", client: true}); err != nil {
		return nil, err
	}
	if f.nodeServing, err = p.issue("node-serving", certSpec{cn: "system:node:" + c.nodeName, orgs: []string{"system:nodes"}, dns: []string{c.nodeName, "localhost"}, ips: loopback, server: true}); err != nil {
		return nil, err
	}
	if f.cmServing, err = p.issue("controller-manager-serving", certSpec{cn: "kube-controller-manager", dns: []string{"localhost"}, ips: loopback, server: true}); err != nil {
		return nil, err
	}
	if f.schedServing, err = p.issue("scheduler-serving", certSpec{cn: "kube-scheduler", dns: []string{"localhost"}, ips: loopback, server: true}); err != nil {
		return nil, err
	}
	if f.saKey, f.saPub, err = p.serviceAccountKeys(); err != nil {
		return nil, err
	}
	// The control plane's programs and the node act with system:masters: this is a test
	// cluster; the project's own code should be tested with a narrower identity.
	clients := []struct {
		name, cn, path string
		dst            *string
	}{
		{"admin", "kubeenv-admin", s.path("admin.kubeconfig"), &f.adminKubeconfig},
		{"controller-manager", "system:kube-controller-manager", p.path("controller-manager.kubeconfig"), &f.cmKubeconfig},
		{"scheduler", "system:kube-scheduler", p.path("scheduler.kubeconfig"), &f.schedKubeconfig},
		{"node", "system:node:" + c.nodeName, p.path("node.kubeconfig"), &f.nodeKubeconfig},
	}
	for _, cl := range clients {
		orgs := []string{"system:masters"}
		if cl.name == "node" {
			orgs = append(orgs, "system:nodes")
		}
		id, err := p.issue(cl.name+"-client", certSpec{cn: cl.cn, orgs: orgs, client: true})
		if err != nil {
			return nil, err
		}
		if err := p.kubeconfig(cl.path, f.server, cl.cn, id); err != nil {
			return nil, err
		}
		*cl.dst = cl.path
	}
	token := randomToken()
	f.tokens = p.path("tokens.csv")
	if err := os.WriteFile(f.tokens, []byte(token+",kubeenv-admin-token,kubeenv-admin-token,\"system:masters\"\n"), 0o600); err != nil {
		return nil, err
	}
	f.adminToken = s.path("admin.token")
	if err := os.WriteFile(f.adminToken, []byte(token+"\n"), 0o600); err != nil {
		return nil, err
	}
	return f, nil
}

// startControlPlane starts etcd and kube-apiserver and waits for /readyz.
func (s *supervisor) startControlPlane(ctx context.Context, f *files) error {
	c := s.cfg
	etcd, err := s.spawn("etcd", syscall.SIGKILL,
		"--data-dir="+s.path("etcd"),
		fmt.Sprintf("--listen-client-url=http://127.0.0.1:%d", c.etcdPort),
		fmt.Sprintf("--listen-peer-url=http://127.0.0.1:%d", c.etcdPeerPort),
	)
	if err != nil {
		return err
	}
	apiserver, err := s.spawn("kube-apiserver", syscall.SIGKILL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.apiserverPort),
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", c.etcdPort),
		"--cert-dir="+s.path("pki"),
		"--tls-cert-file="+f.apiserver.certFile,
		"--tls-private-key-file="+f.apiserver.keyFile,
		"--client-ca-file="+f.ca,
		"--token-auth-file="+f.tokens,
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+f.saPub,
		"--service-account-signing-key-file="+f.saKey,
		"--service-cluster-ip-range=10.96.0.0/24",
		"--endpoint-reconciler-type=none",
		"--kubelet-client-certificate="+f.kubeletClient.certFile,
		"--kubelet-client-key="+f.kubeletClient.keyFile,
		"--kubelet-certificate-authority="+f.ca,
		"--kubelet-preferred-address-types=InternalIP",
		"--allow-privileged=true",
		"--profiling=false",
		fmt.Sprintf("--v=%d", c.verbosity),
	)
	if err != nil {
		return err
	}
	t := time.Now()
	client, err := adminClient(f)
	if err != nil {
		return err
	}
	if err := s.waitFor(ctx, "kube-apiserver /readyz", []*child{etcd, apiserver}, func(ctx context.Context) error {
		_, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	}); err != nil {
		return err
	}
	logf("kube-apiserver ready in %d ms", time.Since(t).Milliseconds())

	if err := provisioner.EnsureStorageClass(ctx, client, c.storageClass); err != nil {
		return err
	}
	if c.runtimeClass != "" {
		rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: c.runtimeClass}, Handler: "runsc"}
		if _, err := client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create runtime class %s: %w", c.runtimeClass, err)
		}
	}
	return nil
}

// startNodeAndControllers starts kube-controller-manager, kube-scheduler and the node, then
// waits for their health endpoints, for the node to be Ready without taints, and for the
// default service account (proof the controllers work).
func (s *supervisor) startNodeAndControllers(ctx context.Context, f *files) error {
	c := s.cfg
	cm, err := s.spawn("kube-controller-manager", syscall.SIGKILL,
		"--kubeconfig="+f.cmKubeconfig,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.cmPort),
		"--tls-cert-file="+f.cmServing.certFile,
		"--tls-private-key-file="+f.cmServing.keyFile,
		"--leader-elect=false",
		"--controllers=serviceaccount-controller,namespace-controller,garbage-collector-controller,persistentvolume-binder-controller,persistentvolumeclaim-protection-controller,persistentvolume-protection-controller,root-ca-certificate-publisher-controller,pod-garbage-collector-controller,node-lifecycle-controller",
		"--pvclaimbinder-sync-period=1s",
		"--service-account-private-key-file="+f.saKey,
		"--root-ca-file="+f.ca,
		"--use-service-account-credentials=false",
		"--cluster-name=kubeenv",
		"--profiling=false",
		fmt.Sprintf("--v=%d", c.verbosity),
	)
	if err != nil {
		return err
	}
	sched, err := s.spawn("kube-scheduler", syscall.SIGKILL,
		"--kubeconfig="+f.schedKubeconfig,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.schedulerPort),
		"--tls-cert-file="+f.schedServing.certFile,
		"--tls-private-key-file="+f.schedServing.keyFile,
		"--leader-elect=false",
		"--profiling=false",
		fmt.Sprintf("--v=%d", c.verbosity),
	)
	if err != nil {
		return err
	}
	nodeArgs := []string{
		"--name=" + c.nodeName,
		"--kubeconfig=" + f.nodeKubeconfig,
		"--address=127.0.0.1",
		fmt.Sprintf("--port=%d", c.kubeletPort),
		"--ca-cert=" + f.ca,
		"--tls-cert=" + f.nodeServing.certFile,
		"--tls-key=" + f.nodeServing.keyFile,
		"--runsc=" + c.runscPath,
		"--platform=" + c.platform,
		"--data-dir=" + s.path("node"),
		"--storage-class=" + c.storageClass,
	}
	for _, img := range c.images {
		nodeArgs = append(nodeArgs, "--image="+img)
	}
	// SIGTERM, not SIGKILL, when the supervisor dies: the node then still deletes its runsc
	// containers (sandboxes are not its children: killing it would leave them running).
	node, err := s.spawn("vknode", syscall.SIGTERM, nodeArgs...)
	if err != nil {
		return err
	}
	all := []*child{s.children[0], s.children[1], cm, sched, node}
	t := time.Now()
	client, err := adminClient(f)
	if err != nil {
		return err
	}
	health, err := healthClient(f.ca)
	if err != nil {
		return err
	}
	for _, h := range []struct{ name, url string }{
		{"kube-controller-manager /healthz", fmt.Sprintf("https://127.0.0.1:%d/healthz", c.cmPort)},
		{"kube-scheduler /healthz", fmt.Sprintf("https://127.0.0.1:%d/healthz", c.schedulerPort)},
	} {
		if err := s.waitFor(ctx, h.name, all, func(ctx context.Context) error { return get(ctx, health, h.url) }); err != nil {
			return err
		}
	}
	logf("controller-manager and scheduler healthy in %d ms", time.Since(t).Milliseconds())
	if err := s.watchUntil(ctx, all, "node "+c.nodeName+" Ready without taints", func(ctx context.Context) (bool, error) {
		return watchFor[*corev1.Node](ctx, client.CoreV1().Nodes(), c.nodeName, func(n *corev1.Node) bool {
			if len(n.Spec.Taints) > 0 {
				return false
			}
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					return cond.Status == corev1.ConditionTrue
				}
			}
			return false
		})
	}); err != nil {
		return err
	}
	logf("node %s ready in %d ms", c.nodeName, time.Since(t).Milliseconds())
	if err := s.watchUntil(ctx, all, "service account default/default", func(ctx context.Context) (bool, error) {
		return watchFor[*corev1.ServiceAccount](ctx, client.CoreV1().ServiceAccounts("default"), "default", func(*corev1.ServiceAccount) bool { return true })
	}); err != nil {
		return err
	}
	return nil
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
	if !strings.HasPrefix(s.runsc.Root, s.cfg.dir+"/") {
		// The short runsc root outside the folder (see runsc.RootFor): remove it once empty
		// of containers.
		if ids, err := s.runsc.IDs(); err == nil && len(ids) == 0 {
			_ = os.RemoveAll(s.runsc.Root)
		}
	}
	_ = os.Remove(s.path("pid"))
}

// adminClient is a client with the admin kubeconfig.
func adminClient(f *files) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", f.adminKubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 10 * time.Second
	return kubernetes.NewForConfig(cfg)
}

// healthClient is an HTTPS client trusting the cluster CA.
func healthClient(caFile string) (*http.Client, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 2 * time.Second}, nil
}

func get(ctx context.Context, c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
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

func readPid(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// isSupervisor reports whether pid is a running `kubeenv up`.
func isSupervisor(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	return len(args) >= 2 && filepath.Base(args[0]) == "kubeenv" && args[1] == "up"
}

// down stops the supervisor of a folder (SIGTERM by the pid in DIR/pid) and waits for it.
func down(args []string) error {
	fs := flag.NewFlagSet("down", flag.ExitOnError)
	dir := fs.String("dir", "", "the cluster's folder (required)")
	timeout := fs.Duration("timeout", 60*time.Second, "how long to wait for the supervisor to exit")
	_ = fs.Parse(args)
	if *dir == "" {
		return errors.New("--dir is required")
	}
	pid := readPid(filepath.Join(*dir, "pid"))
	if pid <= 0 || !isSupervisor(pid) {
		logf("no kubeenv supervisor runs on %s", *dir)
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("signal pid %d: %w", pid, err)
	}
	deadline := time.Now().Add(*timeout)
	for isSupervisor(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("supervisor pid %d still runs after %s", pid, *timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	logf("supervisor pid %d stopped", pid)
	return nil
}
