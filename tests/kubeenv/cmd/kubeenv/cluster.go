package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"sandboxd/tests/kubeenv/internal/provisioner"
)

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
	for _, rc := range []struct{ name, handler string }{{c.runtimeClass, "runsc"}, {c.runcRuntimeClass, "runc"}} {
		if rc.name == "" {
			continue
		}
		obj := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: rc.name}, Handler: rc.handler}
		if _, err := client.NodeV1().RuntimeClasses().Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create runtime class %s: %w", rc.name, err)
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
	if c.runcRuntimeClass != "" {
		nodeArgs = append(nodeArgs, "--runc="+c.runcPath)
	}
	for _, img := range c.images {
		nodeArgs = append(nodeArgs, "--image="+img)
	}
	for _, l := range c.layouts {
		nodeArgs = append(nodeArgs, "--oci-layout="+l)
	}
	// SIGTERM, not SIGKILL, when the supervisor dies: the node then still deletes its
	// containers (they are not its children: killing it would leave them running).
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
