package kube

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"sandboxd/guest/proto"
	"sandboxd/runtime"
)

func testRecord() runtime.Record {
	now := time.Date(2026, 11, 30, 21, 0, 0, 123e6, time.UTC)
	return runtime.Record{
		ID: "sbx_01JDQ8Z6W9X3K2M4N5P6Q7R8S9", Tenant: "acme corp/ü", Project: "p1",
		Spec: runtime.BoxSpec{Profile: "default", Image: "img:1", MilliCPU: 1500, MemoryBytes: 512 << 20,
			DiskBytes: 2 << 30, Network: "none", Env: map[string]string{"B": "2", "A": "1"}},
		State: "RUNNING", StateReason: "because", DesiredState: "RUNNING", LatestCheckpoint: "ckpt_1",
		AutostopSec: 1800, TTLSec: 86400, CreatedAt: now, StateChangedAt: now.Add(time.Second),
		Annotations: map[string]string{"source": "gs://b/p", "odd key/ü": "v"},
		Labels:      map[string]string{"team": "ml", "example.com/tier": "gold", "empty": ""},
	}
}

func TestRecordRoundTrip(t *testing.T) {
	for _, rec := range []runtime.Record{testRecord(), {ID: "sbx_01JDQ8Z6W9X3K2M4N5P6Q7R8S9"}} {
		ann := map[string]string{"other.io/keep": "x"}
		if err := encodeRecord(ann, rec); err != nil {
			t.Fatal(err)
		}
		for k := range ann {
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				t.Errorf("annotation key %q is invalid: %v", k, errs)
			}
		}
		got, err := decodeRecord(boxLabels(rec), ann)
		if err != nil {
			t.Fatal(err)
		}
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(rec)
		if string(g) != string(w) {
			t.Errorf("round trip:\n got %s\nwant %s", g, w)
		}
		if ann["other.io/keep"] != "x" {
			t.Errorf("encoding dropped a foreign annotation")
		}
	}
	// An update that clears a field removes its annotation.
	ann := map[string]string{}
	rec := testRecord()
	_ = encodeRecord(ann, rec)
	rec.StateReason, rec.Annotations, rec.Labels = "", nil, nil
	_ = encodeRecord(ann, rec)
	if _, ok := ann[AnnStateReason]; ok {
		t.Errorf("a cleared state reason stayed")
	}
	if _, ok := ann[AnnLabels]; ok {
		t.Errorf("cleared labels stayed")
	}
	if _, ok := ann[AnnRecordExtra]; ok {
		t.Errorf("cleared annotations stayed")
	}
}

func TestDecodeRejectsBrokenRecords(t *testing.T) {
	labels := map[string]string{LabelSandboxID: "sbx_01JDQ8Z6W9X3K2M4N5P6Q7R8S9"}
	for name, ann := range map[string]map[string]string{
		"no spec":      {},
		"bad spec":     {AnnSpec: "{"},
		"bad autostop": {AnnSpec: "{}", AnnAutostopSec: "x"},
		"bad time":     {AnnSpec: "{}", AnnCreatedAt: "yesterday"},
		"bad extra":    {AnnSpec: "{}", AnnRecordExtra: "[1]"},
	} {
		if _, err := decodeRecord(labels, ann); err == nil {
			t.Errorf("%s: decoded without an error", name)
		}
	}
	if _, err := decodeRecord(map[string]string{}, map[string]string{AnnSpec: "{}"}); err == nil {
		t.Errorf("a record without the id label decoded")
	}
}

func TestObjectNameAndLabels(t *testing.T) {
	name, err := ObjectName("sbx_01JDQ8Z6W9X3K2M4N5P6Q7R8S9")
	if err != nil || name != "sbx-01jdq8z6w9x3k2m4n5p6q7r8s9" {
		t.Errorf("got %q, %v", name, err)
	}
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		t.Errorf("%q is not a DNS label: %v", name, errs)
	}
	for _, bad := range []string{"", "sbx_short", "SBX_01JDQ8Z6W9X3K2M4N5P6Q7R8S9", "sbx_01JDQ8Z6W9X3K2M4N5P6Q7R8S9/x", "../x"} {
		if _, err := ObjectName(bad); err == nil {
			t.Errorf("ObjectName(%q) accepted", bad)
		}
	}
	for in, want := range map[string]string{
		"tenant-a":                    "tenant-a",
		"acme corp/ü":                 "acme-corp",
		"-x-":                         "x",
		strings.Repeat("a", 70):       strings.Repeat("a", 63),
		"a" + strings.Repeat("/", 70): "a",
	} {
		got := labelValue(in)
		if got != want {
			t.Errorf("labelValue(%q) = %q, want %q", in, got, want)
		}
		if errs := validation.IsValidLabelValue(got); len(errs) > 0 {
			t.Errorf("labelValue(%q) = %q is invalid: %v", in, got, errs)
		}
	}
}

// TestBoxLabelsAndMirror: a record's labels go on its objects beside the driver's own, which
// they never replace or remove; an update mirrors the record's new labels onto an object's,
// leaving labels it does not own (an operator's) alone.
func TestBoxLabelsAndMirror(t *testing.T) {
	rec := testRecord()
	rec.Labels[LabelSandboxID] = "sbx_forged"
	rec.Labels["app.kubernetes.io/managed-by"] = "someone"
	l := boxLabels(rec)
	if l["team"] != "ml" || l["example.com/tier"] != "gold" || l["empty"] != "" {
		t.Errorf("the record's labels are missing: %v", l)
	}
	if l[LabelSandboxID] != rec.ID || l[LabelManagedBy] != managedBy {
		t.Errorf("a record's label replaced the driver's: %v", l)
	}
	for k, v := range l {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			t.Errorf("label key %q is invalid: %v", k, errs)
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("label %q=%q is invalid: %v", k, v, errs)
		}
	}

	meta := boxLabels(testRecord())
	meta["operator"] = "kept"
	prev := testRecord().Labels
	next := map[string]string{"team": "infra", "new": "1", LabelSandboxID: "x"}
	if !mirrorLabels(meta, prev, next) {
		t.Fatal("mirrorLabels reported no change")
	}
	want := boxLabels(runtime.Record{ID: rec.ID, Tenant: rec.Tenant, Project: rec.Project, Spec: rec.Spec,
		Labels: map[string]string{"team": "infra", "new": "1"}})
	want["operator"] = "kept"
	if g, w := fmtLabels(meta), fmtLabels(want); g != w {
		t.Errorf("mirrored:\n got %s\nwant %s", g, w)
	}
	if mirrorLabels(meta, next, next) {
		t.Error("mirroring the same labels again reported a change")
	}
}

// TestPodShapeImageHasInit: a profile whose image carries the init gets no init container and
// no shared folder over /.sbx; the key is the pod's annotation, PID 1 waits for it, and the
// sandbox container's spec never holds it.
// TestPodInitImageOnlyWhenNeeded: a driver without an init image makes pods for images that
// carry the init, and refuses, naming both settings, the others.
func TestPodInitImageOnlyWhenNeeded(t *testing.T) {
	set := podSettings{namespace: "sandbox-jobs", runtimeClass: "gvisor"}
	rec := testRecord()
	_, err := set.newPod("sbx-x", rec)
	if err == nil || !strings.Contains(err.Error(), "image_has_init") || !strings.Contains(err.Error(), "kube.init_image") {
		t.Errorf("an image without the init, no init image: got %v, want a refusal naming both settings", err)
	}
	rec.Spec.ImageHasInit = true
	pod, err := set.newPod("sbx-x", rec)
	if err != nil || len(pod.Spec.InitContainers) != 0 {
		t.Errorf("an image with the init, no init image: %v, %d init containers, want a pod without any", err, len(pod.Spec.InitContainers))
	}
}

func TestPodShapeImageHasInit(t *testing.T) {
	set := podSettings{namespace: "sandbox-jobs", initImage: "init:1", runtimeClass: "gvisor"}
	rec := testRecord()
	rec.Spec.ImageHasInit = true
	pod, err := set.newPod("sbx-x", rec)
	if err != nil {
		t.Fatal(err)
	}
	s := pod.Spec
	if len(s.InitContainers) != 0 {
		t.Errorf("init containers %+v, want none", s.InitContainers)
	}
	c := s.Containers[0]
	if c.Image != "img:1" || strings.Join(c.Command, " ") != "/.sbx/init serve" {
		t.Errorf("container %+v", c)
	}
	for _, v := range s.Volumes {
		if v.Name == initVolume {
			t.Errorf("volume %+v over the image's /.sbx", v)
		}
	}
	for _, m := range c.VolumeMounts {
		if m.MountPath == initDir {
			t.Errorf("mount %+v over the image's /.sbx", m)
		}
	}
	key, err := podChannelKey(pod)
	if err != nil {
		t.Fatalf("podChannelKey: %v", err)
	}
	if b, _ := json.Marshal(s); strings.Contains(string(b), proto.EncodeChannelKey(key)) {
		t.Errorf("the pod's spec carries the channel key")
	}
	for _, want := range []corev1.EnvVar{{Name: proto.ChannelKeyFileEnv, Value: channelKeyFile}, {Name: proto.ChannelKeyAwaitEnv, Value: "1"}} {
		if !slices.Contains(c.Env, want) {
			t.Errorf("the sandbox container's env %v lacks %v", c.Env, want)
		}
	}
	if provisioned(pod) {
		t.Errorf("a new pod whose PID 1 waits for its key counts as provisioned")
	}
	pod.Annotations[AnnChannelReady] = "true"
	if !provisioned(pod) {
		t.Errorf("a pod marked ready does not count as provisioned")
	}
	rec.Spec.ImageHasInit = false
	if old, _ := set.newPod("sbx-x", rec); !provisioned(old) {
		t.Errorf("a pod with an init container does not count as provisioned")
	}
}

func fmtLabels(m map[string]string) string {
	b, _ := json.Marshal(m)
	return string(b)
}

func TestPodShape(t *testing.T) {
	set := podSettings{namespace: "sandbox-jobs", initImage: "init:1", runtimeClass: "gvisor", storageClass: "fast"}
	rec := testRecord()
	pod, err := set.newPod("sbx-x", rec)
	if err != nil {
		t.Fatal(err)
	}
	s := pod.Spec
	if *s.RuntimeClassName != "gvisor" || *s.AutomountServiceAccountToken || *s.EnableServiceLinks ||
		s.RestartPolicy != corev1.RestartPolicyNever || s.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod spec misses a setting: %+v", s)
	}
	ic, c := s.InitContainers[0], s.Containers[0]
	if ic.Image != "init:1" || strings.Join(ic.Command, " ") != "/sandbox-init install /.sbx/init" {
		t.Errorf("init container %+v", ic)
	}
	if c.Image != "img:1" || strings.Join(c.Command, " ") != "/.sbx/init serve" || c.WorkingDir != "/workspace" {
		t.Errorf("container %+v", c)
	}
	if c.Env[0].Name != "A" || c.Env[1].Name != "B" {
		t.Errorf("env not sorted: %v", c.Env)
	}
	// The channel key: in the init container's environment only, a new one per pod; the
	// sandbox container knows only where PID 1 takes it from.
	key, err := podChannelKey(pod)
	if err != nil {
		t.Fatalf("podChannelKey: %v", err)
	}
	for _, e := range c.Env {
		if e.Name == proto.ChannelKeyEnv || strings.Contains(e.Value, proto.EncodeChannelKey(key)) {
			t.Errorf("the sandbox container's environment carries the channel key: %v", e)
		}
	}
	if !slices.Contains(c.Env, corev1.EnvVar{Name: proto.ChannelKeyFileEnv, Value: "/run/sbx/channel.key"}) {
		t.Errorf("the sandbox container does not name the key file: %v", c.Env)
	}
	if run := s.Volumes[2]; run.Name != runVolume || run.EmptyDir == nil || run.EmptyDir.Medium != corev1.StorageMediumMemory {
		t.Errorf("run volume %+v, want a memory-backed emptyDir", run)
	}
	other, _ := set.newPod("sbx-x", rec)
	if k2, _ := podChannelKey(other); string(k2) == string(key) {
		t.Errorf("two pods got the same channel key")
	}
	if got := c.Resources.Limits.Cpu().MilliValue(); got != 1500 {
		t.Errorf("cpu limit %d", got)
	}
	if got := c.Resources.Requests.Cpu().MilliValue(); got != 150 {
		t.Errorf("cpu request %d", got)
	}
	if got := c.Resources.Limits.Memory().Value(); got != 512<<20 {
		t.Errorf("memory limit %d", got)
	}
	if *c.SecurityContext.AllowPrivilegeEscalation {
		t.Errorf("privilege escalation allowed")
	}
	if pod.Labels[LabelSandboxID] != rec.ID || pod.Labels[LabelManagedBy] != "sandboxd" || pod.Labels[LabelTenant] != "acme-corp" {
		t.Errorf("labels %v", pod.Labels)
	}
	if s.Volumes[1].PersistentVolumeClaim.ClaimName != "sbx-x" {
		t.Errorf("workspace volume %+v", s.Volumes[1])
	}
	pvc, err := set.newPVC("sbx-x", rec)
	if err != nil {
		t.Fatal(err)
	}
	if *pvc.Spec.StorageClassName != "fast" || pvc.Spec.Resources.Requests.Storage().Value() != 2<<30 || pvc.Annotations[AnnCompute] != computeRunning {
		t.Errorf("pvc %+v", pvc)
	}
	rec.Spec.Image = ""
	if _, err := set.newPod("sbx-x", rec); err == nil || !strings.Contains(err.Error(), "names no image") {
		t.Errorf("a spec without an image: got %v", err)
	}
}

func TestPhase(t *testing.T) {
	ready := func() *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	}
	now := metav1.Now()
	deleting := ready()
	deleting.DeletionTimestamp = &now
	oom := ready()
	oom.Status.Phase = corev1.PodFailed
	oom.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "sandbox",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}}}
	pulling := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: "nope:1"}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{Name: "sandbox",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "not found"}}}}}}
	evicted := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "The node was low on resource: memory."}}
	pending := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending}}
	for _, tc := range []struct {
		name   string
		pod    *corev1.Pod
		want   bool
		phase  runtime.Phase
		reason string
		lost   bool
	}{
		{"running", ready(), true, runtime.PhaseRunning, "", false},
		{"stopped", nil, false, runtime.PhaseStopped, "", false},
		{"stopping", deleting, false, runtime.PhaseStopped, "", false},
		{"deleted behind our back", nil, true, runtime.PhaseFailed, "pod is gone", true},
		{"being deleted behind our back", deleting, true, runtime.PhaseFailed, "being deleted", true},
		{"evicted", evicted, true, runtime.PhaseFailed, "evicted: The node was low on resource: memory.", true},
		{"oom", oom, true, runtime.PhaseFailed, "out of memory", false},
		{"image", pulling, true, runtime.PhaseFailed, `cannot run image "nope:1": ImagePullBackOff: not found`, false},
		{"pending", pending, true, runtime.PhaseStopped, "pending", false},
	} {
		p, reason, lost := phase(tc.pod, tc.want)
		if p != tc.phase || !strings.Contains(reason, tc.reason) || lost != tc.lost {
			t.Errorf("%s: got %s %q lost=%v, want %s containing %q lost=%v", tc.name, p, reason, lost, tc.phase, tc.reason, tc.lost)
		}
	}
}
