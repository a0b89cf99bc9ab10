// Command vknode is the test cluster's node: a virtual-kubelet (v1.14.1, nodeutil.NewNode)
// whose pods run as real gVisor containers with runsc on this host, or as native runc
// containers when their RuntimeClass has handler runc (package provider), plus a small
// hostPath volume provisioner for one StorageClass (package provisioner).
//
//	vknode --kubeconfig FILE --ca-cert CA --tls-cert CRT --tls-key KEY \
//	       --runsc PATH [--runc PATH] --data-dir DIR [--image NAME=DIR ...] [--oci-layout DIR ...]
//
// The node registers Ready, with no taints, InternalIP 127.0.0.1 and a large allocatable
// (cpu 64, memory 256Gi, pods 500). Its kubelet API (exec, logs) is served over TLS with the
// given certificate and requires a client certificate of the same CA: the API server's
// kubelet client (CN kube-apiserver-kubelet-client) or a member of system:masters.
//
// On SIGTERM or SIGINT it tears every pod down (runsc and runc containers killed and
// deleted, pod folders removed) and exits. At start it removes what an earlier run left in its data dir.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/log"
	vkslog "github.com/virtual-kubelet/virtual-kubelet/log/slog"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"sandboxd/tests/kubeenv/internal/ocilayout"
	"sandboxd/tests/kubeenv/internal/provider"
	"sandboxd/tests/kubeenv/internal/provisioner"
	"sandboxd/tests/kubeenv/internal/runc"
	"sandboxd/tests/kubeenv/internal/runsc"
	"sandboxd/tests/kubeenv/internal/shim"
)

// kubeletVersion is what the node reports as its kubelet version.
const kubeletVersion = "v1.37.2"

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

type options struct {
	name, kubeconfig, address     string
	port                          int
	caCert, tlsCert, tlsKey       string
	runscPath, platform, dataDir  string
	runcPath                      string
	runscFlags, images, layouts   multiFlag
	storageClass, logLevel        string
	allowedClient                 string
	readyTimeout, shutdownTimeout time.Duration
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == shim.Subcommand {
		os.Exit(shim.Main(os.Args[2:]))
	}
	var o options
	flag.StringVar(&o.name, "name", "sandbox-node", "node name")
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the node's client (required)")
	flag.StringVar(&o.address, "address", "127.0.0.1", "address of the kubelet API and the node's InternalIP")
	flag.IntVar(&o.port, "port", 10250, "port of the kubelet API (exec, logs)")
	flag.StringVar(&o.caCert, "ca-cert", "", "cluster CA certificate: clients of the kubelet API must present a certificate it signed (required)")
	flag.StringVar(&o.tlsCert, "tls-cert", "", "serving certificate of the kubelet API (required)")
	flag.StringVar(&o.tlsKey, "tls-key", "", "key of the serving certificate (required)")
	flag.StringVar(&o.allowedClient, "allowed-client", "kube-apiserver-kubelet-client", "client certificate CN allowed on the kubelet API (besides group system:masters)")
	flag.StringVar(&o.runscPath, "runsc", "", "runsc binary (required)")
	flag.StringVar(&o.runcPath, "runc", "", "runc binary (Debian's: /usr/sbin/runc): runs the pods of RuntimeClass handler runc (empty: such pods fail)")
	flag.StringVar(&o.platform, "platform", "systrap", "runsc --platform")
	flag.Var(&o.runscFlags, "runsc-flag", "extra runsc global flag (repeatable), e.g. --runsc-flag=--debug")
	flag.StringVar(&o.dataDir, "data-dir", "", "folder of the node's state: runsc root, pod folders, volumes (required)")
	flag.Var(&o.images, "image", "NAME=DIR: run image NAME from the rootfs folder DIR (repeatable)")
	flag.Var(&o.layouts, "oci-layout", "DIR: an OCI image layout whose images (by their org.opencontainers.image.ref.name) the node unpacks into its data dir and runs (repeatable)")
	flag.StringVar(&o.storageClass, "storage-class", "sandbox-local", "StorageClass whose claims the built-in provisioner serves (empty: no provisioner)")
	flag.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	flag.DurationVar(&o.readyTimeout, "ready-timeout", 60*time.Second, "how long to wait for the API server and the node's registration")
	flag.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 20*time.Second, "how long the pods' teardown may take on exit")
	flag.Parse()

	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "vknode: --log-level: %v\n", err)
		os.Exit(2)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(logger)
	log.L = vkslog.FromSlog(logger.With("component", "virtual-kubelet"))

	if err := run(o, logger); err != nil {
		logger.Error("vknode failed", "err", err)
		os.Exit(1)
	}
}

func run(o options, logger *slog.Logger) error {
	for name, v := range map[string]string{"--kubeconfig": o.kubeconfig, "--ca-cert": o.caCert, "--tls-cert": o.tlsCert, "--tls-key": o.tlsKey, "--runsc": o.runscPath, "--data-dir": o.dataDir} {
		if v == "" {
			return fmt.Errorf("%s is required", name)
		}
	}
	images := map[string]string{}
	for _, kv := range o.images {
		name, dir, ok := strings.Cut(kv, "=")
		if !ok || name == "" || dir == "" {
			return fmt.Errorf("--image %q: want NAME=DIR", kv)
		}
		abs, err := filepath.Abs(dir)
		if err != nil {
			return fmt.Errorf("--image %s: %w", kv, err)
		}
		images[name] = abs
	}
	dataDir, err := filepath.Abs(o.dataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dataDir, 0o711); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	for _, l := range o.layouts {
		start := time.Now()
		refs, err := ocilayout.Unpack(l, filepath.Join(dataDir, "images"))
		if err != nil {
			return fmt.Errorf("--oci-layout %s: %w", l, err)
		}
		for ref, dir := range refs {
			images[ref] = dir
			logger.Info("image unpacked", "image", ref, "layout", l, "ms", time.Since(start).Milliseconds())
		}
	}
	cli := &runsc.CLI{
		Path:  o.runscPath,
		Root:  runsc.RootFor(dataDir),
		Flags: append([]string{"--platform=" + o.platform, "--network=none", "--overlay2=root:memory"}, o.runscFlags...),
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	runscVersion, err := cli.Version(ctx)
	if err != nil {
		return err
	}
	var runcCLI *runc.CLI
	runcVersion := "none"
	if o.runcPath != "" {
		runcCLI = &runc.CLI{Path: o.runcPath, Root: runc.RootFor(dataDir), CgroupParent: runc.CgroupParentFor(dataDir)}
		if runcVersion, err = runcCLI.Version(ctx); err != nil {
			return err
		}
	}
	if err := provider.Cleanup(ctx, provider.Config{DataDir: dataDir, Runsc: cli, Runc: runcCLI}); err != nil {
		return err
	}

	restCfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	restCfg.QPS, restCfg.Burst = 100, 200
	restCfg.UserAgent = "vknode/" + o.name
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if err := waitAPIServer(ctx, client, o.readyTimeout); err != nil {
		return err
	}

	if o.storageClass != "" {
		prov, err := provisioner.New(provisioner.Config{Client: client, StorageClass: o.storageClass, Dir: filepath.Join(dataDir, "pv"), Logger: logger})
		if err != nil {
			return err
		}
		go func() {
			if err := prov.Run(ctx); err != nil {
				logger.Error("provisioner stopped", "err", err)
			}
		}()
	}

	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("own binary (it runs the containers' shims): %w", err)
	}
	var prov *provider.Provider
	newProvider := func(pc nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) {
		p, err := provider.New(provider.Config{
			NodeName: o.name, DataDir: dataDir, Runsc: cli, Runc: runcCLI, Images: images, Self: self,
			Client: client, Pods: pc.Pods, Logger: logger.With("component", "provider"),
		})
		if err != nil {
			return nil, nil, err
		}
		prov = p
		// The node's status is static (set below): it registers Ready and stays so.
		return p, node.NaiveNodeProvider{}, nil
	}

	// nodeutil.NewNode builds a default client from $KUBECONFIG before its options apply (and
	// warns when it cannot): point it at the node's kubeconfig too.
	_ = os.Setenv("KUBECONFIG", o.kubeconfig)
	mux := http.NewServeMux()
	addr := net.JoinHostPort(o.address, strconv.Itoa(o.port))
	n, err := nodeutil.NewNode(o.name, newProvider,
		nodeutil.WithClient(client),
		nodeutil.AttachProviderRoutes(mux),
		nodeutil.WithTLSConfig(nodeutil.WithKeyPairFromPath(o.tlsCert, o.tlsKey), nodeutil.WithCAFromPath(o.caCert)),
		func(cfg *nodeutil.NodeConfig) error {
			cfg.HTTPListenAddr = addr
			cfg.Handler = requireClient(mux, o.allowedClient, logger)
			cfg.InformerResyncPeriod = 0
			cfg.NumWorkers = 4
			cfg.StreamIdleTimeout = 4 * time.Hour
			cfg.StreamCreationTimeout = 30 * time.Second
			setNodeSpec(&cfg.NodeSpec, o, runscVersion)
			return nil
		},
	)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}

	start := time.Now()
	go func() {
		if err := n.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			logger.Error("node stopped", "err", err)
		}
	}()
	if err := n.WaitReady(ctx, o.readyTimeout); err != nil {
		shutdown(prov, o.shutdownTimeout, logger)
		return fmt.Errorf("node not ready: %w", err)
	}
	logger.Info("node ready", "name", o.name, "kubelet_api", addr, "runsc", runscVersion, "runc", runcVersion, "images", len(images), "ms", time.Since(start).Milliseconds())

	select {
	case <-ctx.Done():
		logger.Info("stopping: tearing pods down")
	case <-n.Done():
		logger.Error("node controller exited", "err", n.Err())
	}
	// Controllers stop taking work; the pods are torn down at once (the supervisor sends
	// SIGKILL 5 s after SIGTERM; should that come first, each container's shim deletes it).
	stop()
	serr := shutdown(prov, o.shutdownTimeout, logger)
	select {
	case <-n.Done():
	case <-time.After(2 * time.Second):
		logger.Warn("node controllers did not stop within 2 s")
	}
	if serr != nil {
		return serr
	}
	if err := n.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// shutdown tears every pod down and removes the containers left in the node's roots.
func shutdown(p *provider.Provider, timeout time.Duration, logger *slog.Logger) error {
	if p == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	if err := p.Shutdown(ctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	logger.Info("pods torn down", "ms", time.Since(start).Milliseconds())
	return nil
}

// waitAPIServer waits until the API server answers /readyz.
func waitAPIServer(ctx context.Context, client kubernetes.Interface, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		_, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("API server not ready: %w (last: %v)", ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// setNodeSpec fills the node object the node registers: Ready from the start, no taints,
// InternalIP, the kubelet endpoint, and a large allocatable.
func setNodeSpec(n *corev1.Node, o options, runscVersion string) {
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels["kubernetes.io/os"] = "linux"
	n.Labels["kubernetes.io/arch"] = goruntime.GOARCH
	n.Labels["kubernetes.io/hostname"] = o.name
	n.Labels["sandboxd.test/runtime"] = "gvisor"
	n.Spec.Taints = nil
	res := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("64"),
		corev1.ResourceMemory:           resource.MustParse("256Gi"),
		corev1.ResourcePods:             resource.MustParse("500"),
		corev1.ResourceEphemeralStorage: resource.MustParse("1Ti"),
	}
	now := metav1.Now()
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	n.Status = corev1.NodeStatus{
		Phase:       corev1.NodeRunning,
		Capacity:    res,
		Allocatable: res.DeepCopy(),
		Conditions: []corev1.NodeCondition{
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubeenv node is ready (pods run under runsc)"),
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "no memory pressure"),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "no disk pressure"),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "no PID pressure"),
			cond(corev1.NodeNetworkUnavailable, corev1.ConditionFalse, "RouteCreated", "pods run with --network=none"),
		},
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: o.address},
			{Type: corev1.NodeHostName, Address: o.name},
		},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(o.port)}},
		NodeInfo: corev1.NodeSystemInfo{
			OperatingSystem:         "linux",
			Architecture:            goruntime.GOARCH,
			KubeletVersion:          kubeletVersion,
			ContainerRuntimeVersion: "runsc://" + strings.TrimPrefix(runscVersion, "runsc version "),
			OSImage:                 "kubeenv (gVisor)",
		},
	}
}

// requireClient admits requests whose verified client certificate (the TLS config requires
// one signed by the cluster CA) is the API server's kubelet client or a system:masters member.
func requireClient(h http.Handler, allowedCN string, logger *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		cert := r.TLS.VerifiedChains[0][0]
		if cert.Subject.CommonName != allowedCN && !slices.Contains(cert.Subject.Organization, "system:masters") {
			logger.Warn("kubelet API: client not allowed", "cn", cert.Subject.CommonName, "path", r.URL.Path)
			http.Error(w, "Forbidden", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}
