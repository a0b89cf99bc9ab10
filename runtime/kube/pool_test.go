package kube_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sandboxd/guest/proto"
	"sandboxd/internal/kubetest"
	"sandboxd/runtime"
	"sandboxd/runtime/kube"
	"sandboxd/runtime/runtimetest"
)

// TestWarmPoolBoxes: a box made for a pool is labelled a pool member on its PVC and pod, is
// out of Get, List and UpdateRecord and in ListPool; two replicas (two drivers) claiming it at
// once on the cluster get one claim, the other ErrNotFound; the claim relabels the PVC and the
// pod (the owner's tenant and project, the caller's labels, no pool label) and the box is then
// an ordinary one.
func TestWarmPoolBoxes(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	d1, d2 := newDriver(t, cfg), newDriver(t, cfg)
	rec := runtimetest.NewRecord(initSpec)
	rec.Tenant, rec.Project, rec.State, rec.DesiredState, rec.Labels = "", "", "", "", nil
	rec.Pool = "warm profile"
	rec.Annotations = map[string]string{"pool_state": "ready"}
	if err := d1.Create(ctx(t), rec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d1.Delete(context.Background(), rec.ID) })
	name, _ := kube.ObjectName(rec.ID)
	cs := c.Clientset(t).CoreV1()
	pvc, err := cs.PersistentVolumeClaims(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := cs.Pods(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for what, l := range map[string]map[string]string{"PVC": pvc.Labels, "pod": pod.Labels} {
		if l[kube.LabelPool] != "warm-profile" {
			t.Errorf("%s labels %v: want %s=warm-profile", what, l, kube.LabelPool)
		}
	}
	if _, err := d2.Get(ctx(t), rec.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Get of a pool box: %v, want ErrNotFound", err)
	}
	if _, err := d2.UpdateRecord(ctx(t), rec.ID, func(*runtime.Record) error { return nil }); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("UpdateRecord of a pool box: %v, want ErrNotFound", err)
	}
	var pooled []runtime.Box
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if pooled, err = d2.ListPool(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if len(pooled) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(pooled) != 1 || pooled[0].Record.ID != rec.ID || pooled[0].Record.Pool != "warm profile" || pooled[0].Phase != runtime.PhaseRunning {
		t.Fatalf("ListPool: %+v, want the running box of pool %q", pooled, "warm profile")
	}
	list, err := d2.List(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range list {
		if b.Record.ID == rec.ID {
			t.Errorf("List has the pool box")
		}
	}

	// A look (an update that changes nothing) writes nothing.
	before, _ := cs.PersistentVolumeClaims(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{})
	if _, err := d2.UpdatePool(ctx(t), rec.ID, func(*runtime.Record) error { return nil }); err != nil {
		t.Fatalf("a look: %v", err)
	}
	if after, _ := cs.PersistentVolumeClaims(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{}); after.ResourceVersion != before.ResourceVersion {
		t.Errorf("a look wrote the PVC (resourceVersion %s → %s)", before.ResourceVersion, after.ResourceVersion)
	}

	// Both replicas claim it at once, each as its own caller.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, d := range []*kube.Driver{d1, d2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = d.UpdatePool(ctx(t), rec.ID, func(r *runtime.Record) error {
				if r.Annotations["pool_state"] != "ready" {
					return errors.New("not ready")
				}
				r.Pool, r.Tenant, r.Project, r.State = "", []string{"acme", "globex"}[i], "p", "CREATING"
				r.Labels = map[string]string{"team": []string{"a", "b"}[i]}
				delete(r.Annotations, "pool_state")
				return nil
			})
		}()
	}
	wg.Wait()
	won := -1
	for i, err := range errs {
		switch {
		case err == nil && won < 0:
			won = i
		case err == nil:
			t.Fatalf("both replicas claimed the box")
		case !errors.Is(err, runtime.ErrNotFound):
			t.Fatalf("the losing claim: %v, want ErrNotFound", err)
		}
	}
	if won < 0 {
		t.Fatalf("no claim won: %v", errs)
	}
	tenant, team := []string{"acme", "globex"}[won], []string{"a", "b"}[won]
	b, err := d1.Get(ctx(t), rec.ID)
	if err != nil || b.Record.Tenant != tenant || b.Record.Pool != "" || b.Record.Labels["team"] != team {
		t.Fatalf("Get after the claim: %+v %v, want the winner's (%s) record", b.Record, err, tenant)
	}
	if _, err := d2.UpdatePool(ctx(t), rec.ID, func(*runtime.Record) error { return nil }); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("UpdatePool of a claimed box: %v, want ErrNotFound", err)
	}
	// The claim's next record write (the service's RUNNING) returns once the pod's relabel,
	// which runs beside it, has ended.
	if _, err := []*kube.Driver{d1, d2}[won].UpdateRecord(ctx(t), rec.ID, func(r *runtime.Record) error {
		r.State = "RUNNING"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	pvc, _ = cs.PersistentVolumeClaims(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{})
	pod, _ = cs.Pods(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{})
	for what, l := range map[string]map[string]string{"PVC": pvc.Labels, "pod": pod.Labels} {
		if _, ok := l[kube.LabelPool]; ok || l[kube.LabelTenant] != tenant || l["team"] != team || l[kube.LabelSandboxID] != rec.ID {
			t.Errorf("%s labels after the claim %v: want the winner's, no pool label", what, l)
		}
	}
	res := runtimetest.MustRun(t, runtimetest.Client(t, d2, rec.ID), proto.ExecRequest{Argv: []string{"true"}})
	if res.Exit.ExitCode != 0 {
		t.Errorf("exec in the claimed box: %+v", res.Exit)
	}
}
