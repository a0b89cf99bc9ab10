package kube_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"sandboxd/internal/kubetest"
	"sandboxd/runtime"
	"sandboxd/runtime/kube"
	"sandboxd/runtime/runtimetest"
)

// pvcCalls counts the driver's GETs and PUTs of PVCs.
type pvcCalls struct {
	mu       sync.Mutex
	get, put int
}

func (c *pvcCalls) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		if strings.Contains(r.URL.Path, "/persistentvolumeclaims/") && r.URL.Query().Get("watch") == "" {
			c.mu.Lock()
			switch r.Method {
			case http.MethodGet:
				c.get++
			case http.MethodPut:
				c.put++
			}
			c.mu.Unlock()
		}
		return rt.RoundTrip(r)
	})
}

func (c *pvcCalls) take() (get, put int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	get, put, c.get, c.put = c.get, c.put, 0, 0
	return get, put
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestRecordWritesFromTheFreshestCopy: a record write starts from the replica's own last copy
// of the PVC, so writes in a row cost one PUT each and no GET; a copy that is stale (another
// writer came in between) is never written over the other's change, and a refusal on a stale
// copy is asked again on a fresh read.
func TestRecordWritesFromTheFreshestCopy(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	calls := &pvcCalls{}
	counted := rest.CopyConfig(cfg)
	counted.Wrap(calls.wrap)
	d := newDriver(t, counted)
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := runtimetest.CreateBox(t, d, spec)
	name, _ := kube.ObjectName(id)
	set := func(k, v string) func(*runtime.Record) error {
		return func(r *runtime.Record) error {
			if r.Annotations == nil {
				r.Annotations = map[string]string{}
			}
			r.Annotations[k] = v
			return nil
		}
	}

	calls.take()
	for i, v := range []string{"1", "2", "3"} {
		if _, err := d.UpdateRecord(ctx, id, set("test.seq", v)); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	if get, put := calls.take(); get != 0 || put != 3 {
		t.Errorf("three writes in a row: %d GETs and %d PUTs, want 0 and 3", get, put)
	}

	// Another writer (another replica) changes the PVC; this replica's copy is made to look
	// newer than the watch's, so the write starts from it and must conflict.
	stale, err := cs.CoreV1().PersistentVolumeClaims(kubetest.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := cs.CoreV1().PersistentVolumeClaims(kubetest.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other.Annotations["test.sandboxd.io/other-writer"] = "kept"
	if _, err := cs.CoreV1().PersistentVolumeClaims(kubetest.Namespace).Update(ctx, other, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	stale.ResourceVersion = "999999999999"
	kube.PlantCopy(d, stale)
	calls.take()
	rec, err := d.UpdateRecord(ctx, id, set("test.after-stale", "yes"))
	if err != nil {
		t.Fatalf("a write from a stale copy: %v", err)
	}
	if get, put := calls.take(); get != 1 || put != 2 {
		t.Errorf("a write from a stale copy: %d GETs and %d PUTs, want 1 and 2 (the conflict, the read, the write)", get, put)
	}
	got, err := cs.CoreV1().PersistentVolumeClaims(kubetest.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Annotations["test.sandboxd.io/other-writer"] != "kept" {
		t.Errorf("the other writer's annotation is gone: %v", got.Annotations)
	}
	if rec.Annotations["test.after-stale"] != "yes" || rec.Annotations["test.seq"] != "3" {
		t.Errorf("record after the write: %v", rec.Annotations)
	}

	// A refusal on a stale copy is asked again on a fresh read, where it does not refuse.
	stale, err = cs.CoreV1().PersistentVolumeClaims(kubetest.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.UpdateRecord(ctx, id, set("test.ready", "yes")); err != nil {
		t.Fatal(err)
	}
	stale.ResourceVersion = "999999999999"
	kube.PlantCopy(d, stale)
	errNotReady := errors.New("not ready")
	asked := 0
	if _, err := d.UpdateRecord(ctx, id, func(r *runtime.Record) error {
		asked++
		if r.Annotations["test.ready"] != "yes" {
			return errNotReady
		}
		r.Annotations["test.claimed"] = "yes"
		return nil
	}); err != nil {
		t.Fatalf("a refusal on a stale copy came back: %v", err)
	}
	if asked != 2 {
		t.Errorf("asked %d times, want 2 (the stale copy, then the fresh read)", asked)
	}
	// A refusal on a fresh read stands.
	if _, err := d.UpdateRecord(ctx, id, func(r *runtime.Record) error { return errNotReady }); !errors.Is(err, errNotReady) {
		t.Errorf("a refusal on a fresh read: got %v", err)
	}

	// A copy of a PVC deleted since (by another replica): the write is ErrNotFound, as a read
	// of it would be.
	last, err := cs.CoreV1().PersistentVolumeClaims(kubetest.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := newDriver(t, cfg).Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	last.ResourceVersion = "999999999999"
	kube.PlantCopy(d, last)
	if _, err := d.UpdateRecord(ctx, id, set("test.after-delete", "yes")); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("a write from a copy of a deleted PVC: got %v, want ErrNotFound", err)
	}
}
