package kubeenv_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sandboxd/tests/kubeenv/internal/runsc"
)

func (e *env) createPVC(ctx context.Context, name string) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	pvc, err := e.client.CoreV1().PersistentVolumeClaims(namespace).Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create PVC: %v", err)
	}
	return pvc
}

// runPod creates the pod and waits until it is Running and Ready.
func (e *env) runPod(ctx context.Context, pod *corev1.Pod) {
	t := e.t
	if _, err := e.client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	waitFor(ctx, t, e.client.CoreV1().Pods(namespace), pod.Name, "pod Running and Ready", func(p *corev1.Pod) (bool, error) {
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			b, _ := json.MarshalIndent(p.Status, "", "  ")
			return false, fmt.Errorf("pod ended: %s", b)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				return p.Status.Phase == corev1.PodRunning && c.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
}

func (e *env) podUID(ctx context.Context, name string) string {
	p, err := e.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("get pod: %v", err)
	}
	return string(p.UID)
}

// deletePod deletes a pod with grace 0 and waits until it is gone.
func (e *env) deletePod(ctx context.Context, name string) {
	if err := e.client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		e.t.Fatalf("delete pod %s: %v", name, err)
	}
	waitGone[*corev1.Pod](ctx, e.t, e.client.CoreV1().Pods(namespace), name)
}

// waitNodeClean waits (briefly) until the node has no runsc container and no folder of pod uid.
func (e *env) waitNodeClean(ctx context.Context, uid string) {
	t := e.t
	deadline := time.Now().Add(10 * time.Second)
	podDir := filepath.Join(e.dir, "node", "pods", uid)
	for {
		states, _ := filepath.Glob(filepath.Join(runsc.RootFor(filepath.Join(e.dir, "node")), "*.state"))
		_, err := os.Stat(podDir)
		if len(states) == 0 && os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the pod was deleted: runsc containers %v, pod folder present: %v", states, err == nil)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
