package kube

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func pvcAt(rv string, uid types.UID) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "sbx-a", ResourceVersion: rv, UID: uid,
		Annotations: map[string]string{"rv": rv}}}
}

func TestPVCCopies(t *testing.T) {
	var c pvcCopies
	if got := c.freshest("sbx-a", nil); got != nil {
		t.Fatalf("nothing held, nothing watched: got %v", got)
	}
	watched := pvcAt("10", "u1")
	if got := c.freshest("sbx-a", watched); got == watched || got.ResourceVersion != "10" {
		t.Fatalf("only the watch's: got %+v, want a copy of it", got)
	}

	c.keep(pvcAt("12", "u1"))
	c.keep(pvcAt("11", "u1")) // an older answer that arrives late changes nothing
	if got := c.freshest("sbx-a", watched); got.ResourceVersion != "12" {
		t.Fatalf("own 12 against watched 10: got %s", got.ResourceVersion)
	}
	got := c.freshest("sbx-a", watched)
	got.Annotations["rv"] = "changed"
	if again := c.freshest("sbx-a", watched); again.Annotations["rv"] != "12" {
		t.Fatal("a caller's change of its copy reached the held one")
	}

	c.seen(pvcAt("11", "u1")) // the watch still behind: kept
	if got := c.freshest("sbx-a", nil); got == nil || got.ResourceVersion != "12" {
		t.Fatalf("after the watch's 11: got %v, want the own 12", got)
	}
	c.seen(pvcAt("12", "u1")) // caught up: dropped
	if got := c.freshest("sbx-a", nil); got != nil {
		t.Fatalf("after the watch's 12: got %s, want nothing held", got.ResourceVersion)
	}

	c.keep(pvcAt("20", "u1"))
	if got := c.freshest("sbx-a", pvcAt("21", "u1")); got.ResourceVersion != "21" {
		t.Fatalf("watched 21 against own 20: got %s", got.ResourceVersion)
	}
	if len(c.m) != 0 {
		t.Fatalf("a copy older than the watch's is still held: %v", c.m)
	}

	c.keep(pvcAt("30", "u1"))
	if got := c.freshest("sbx-a", pvcAt("5", "u2")); got.ResourceVersion != "5" {
		t.Fatalf("a PVC made again under the name (another uid): got %s, want the watch's", got.ResourceVersion)
	}
	c.keep(pvcAt("30", "u1"))
	if got := c.freshest("sbx-a", pvcAt("not-a-number", "u1")); got.ResourceVersion != "not-a-number" {
		t.Fatalf("versions that do not compare: got %s, want the watch's", got.ResourceVersion)
	}
	c.keep(pvcAt("30", "u1"))
	c.forget("sbx-a")
	if got := c.freshest("sbx-a", nil); got != nil {
		t.Fatal("forgotten, still held")
	}
	c.keep(pvcAt("", "u1"))
	if len(c.m) != 0 {
		t.Fatal("a PVC without a version was kept")
	}
}
