package kube_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sandboxd/guest/proto"
	"sandboxd/internal/kubetest"
	"sandboxd/runtime"
	"sandboxd/runtime/kube"
	"sandboxd/runtime/runtimetest"
)

// replacePod deletes a box's pod and creates one of the same name from its spec and labels
// (not its annotations), changed by edit (as someone with the cluster's admin rights could),
// and waits until the driver sees it running.
func replacePod(t *testing.T, c *kubetest.Cluster, id string, edit func(*corev1.Pod)) {
	t.Helper()
	pods := c.Clientset(t).CoreV1().Pods(kubetest.Namespace)
	name, _ := kube.ObjectName(id)
	orig, err := pods.Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	zero := int64(0)
	if err := pods.Delete(ctx(t), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, func() error { _, err := pods.Get(ctx(t), name, metav1.GetOptions{}); return err })
	fake := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: orig.Name, Namespace: orig.Namespace, Labels: orig.Labels}, Spec: *orig.Spec.DeepCopy()}
	fake.Spec.NodeName = ""
	edit(fake)
	if _, err := pods.Create(ctx(t), fake, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		p, err := pods.Get(ctx(t), name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			for _, cs := range p.Status.ContainerStatuses {
				if cs.Ready {
					time.Sleep(500 * time.Millisecond) // the driver's watch
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replaced pod did not run: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// dropKeyFile makes the sandbox container's PID 1 start without a channel key: it then serves
// anyone, as an init of the workload's own would.
func dropKeyFile(s *corev1.PodSpec) {
	for i, ctr := range s.Containers {
		var env []corev1.EnvVar
		for _, e := range ctr.Env {
			if e.Name != proto.ChannelKeyFileEnv {
				env = append(env, e)
			}
		}
		s.Containers[i].Env = env
	}
}

// TestKeylessPod: a pod made without a channel key (by a sandboxd from before them) is
// reported failed, saying to start it again, and a start replaces it with one that works.
func TestKeylessPod(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	d := newDriver(t, cfg)
	id := runtimetest.CreateBox(t, d, spec)
	runtimetest.MustRun(t, runtimetest.Client(t, d, id), proto.ExecRequest{Argv: []string{"sh", "-c", "echo kept > f"}})
	replacePod(t, c, id, func(p *corev1.Pod) {
		for i := range p.Spec.InitContainers {
			p.Spec.InitContainers[i].Env = nil
		}
		dropKeyFile(&p.Spec)
	})
	b, err := d.Get(ctx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if b.Phase != runtime.PhaseFailed || !strings.Contains(b.Reason, "older sandboxd") {
		t.Errorf("got phase %s (%s), want failed: made by an older sandboxd", b.Phase, b.Reason)
	}
	if _, err := d.Start(ctx(t), id); err != nil {
		t.Fatalf("Start: %v", err)
	}
	res := runtimetest.MustRun(t, runtimetest.Client(t, d, id), proto.ExecRequest{Argv: []string{"cat", "f"}})
	if string(res.Stdout) != "kept\n" {
		t.Errorf("after the start got %q, want the kept workspace", res.Stdout)
	}
}

// TestChannelImpostor: the box's pod is replaced (by someone with the cluster's admin rights,
// standing in for a workload that got past every defence of the box) by one whose PID 1 does
// not hold the channel key the driver reads from the pod — a guest init of the workload's own.
// The driver must not talk to it: the attach fails, the pod is deleted, the box is failed with
// the reason (not "lost", so nobody starts it behind the owner's back), another box is
// untouched, and a start gives the box a new pod that works.
func TestChannelImpostor(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	d := newDriver(t, cfg)
	a := runtimetest.CreateBox(t, d, spec)
	b := runtimetest.CreateBox(t, d, spec)
	for _, id := range []string{a, b} {
		runtimetest.MustRun(t, runtimetest.Client(t, d, id), proto.ExecRequest{Argv: []string{"sh", "-c", "echo " + id + " > whoami"}})
	}

	pods := c.Clientset(t).CoreV1().Pods(kubetest.Namespace)
	name, _ := kube.ObjectName(a)
	replacePod(t, c, a, func(p *corev1.Pod) { dropKeyFile(&p.Spec) })
	// Wait until the driver sees the impostor's pod running.
	deadline := time.Now().Add(60 * time.Second)
	for {
		bx, err := d.Get(ctx(t), a)
		if err != nil {
			t.Fatal(err)
		}
		if bx.Phase == runtime.PhaseRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the impostor's pod did not run: %s (%s)", bx.Phase, bx.Reason)
		}
		time.Sleep(100 * time.Millisecond)
	}

	rwc, err := d.Attach(ctx(t), a)
	if err == nil {
		rwc.Close()
		t.Fatal("Attach to the impostor's pod: got a stream, want an error")
	}
	if !errors.Is(err, runtime.ErrNotRunning) || !strings.Contains(err.Error(), "tampered") {
		t.Errorf("Attach: got %v, want ErrNotRunning naming the tampering", err)
	}
	bx, err := d.Get(ctx(t), a)
	if err != nil {
		t.Fatal(err)
	}
	if bx.Phase != runtime.PhaseFailed || bx.Lost || !strings.Contains(bx.Reason, "tampered") {
		t.Errorf("got phase %s lost=%v (%s), want failed (not lost), tampered with", bx.Phase, bx.Lost, bx.Reason)
	}
	waitGone(t, func() error { _, err := pods.Get(ctx(t), name, metav1.GetOptions{}); return err })

	res := runtimetest.MustRun(t, runtimetest.Client(t, d, b), proto.ExecRequest{Argv: []string{"cat", "whoami"}})
	if got := strings.TrimSpace(string(res.Stdout)); got != b {
		t.Errorf("the other box reads whoami %q, want %q", got, b)
	}
	if _, err := d.Start(ctx(t), a); err != nil {
		t.Fatalf("Start after tampering: %v", err)
	}
	res = runtimetest.MustRun(t, runtimetest.Client(t, d, a), proto.ExecRequest{Argv: []string{"cat", "whoami"}})
	if got := strings.TrimSpace(string(res.Stdout)); got != a {
		t.Errorf("after Start the box reads whoami %q, want %q (its kept workspace)", got, a)
	}
	if bx, _ := d.Get(ctx(t), a); bx.Phase != runtime.PhaseRunning || bx.Reason != "" {
		t.Errorf("after Start: got phase %s (%s), want running", bx.Phase, bx.Reason)
	}
}

// waitGone waits until get reports NotFound.
func waitGone(t *testing.T, get func() error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := get()
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still there after 60 s (last: %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
