package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"sandboxd/guest/proto"
	"sandboxd/runtime"
)

// Labels on every object of a box. The sandbox id label is exact (ids are label-safe); the
// tenant, project and profile labels are for selection by operators and are made label-safe,
// so the exact values live in the record's annotations.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "sandboxd"
	LabelSandboxID = "sandboxd.io/sandbox-id"
	LabelTenant    = "sandboxd.io/tenant"
	LabelProject   = "sandboxd.io/project"
	LabelProfile   = "sandboxd.io/profile"
	// LabelPool marks the PVC and pod of a box of a warm pool (its value the profile's name as
	// a label value; the record's AnnPool is the exact name). A claim removes it.
	LabelPool = "sandboxd.io/pool"
)

// Annotations on a box's PVC: the sandbox's record. The PVC lives as long as the sandbox
// (stop deletes only the pod), so the PVC is where the record is kept.
const (
	annPrefix         = "sandboxd.io/"
	AnnTenant         = annPrefix + "tenant"
	AnnProject        = annPrefix + "project"
	AnnSpec           = annPrefix + "spec" // JSON of runtime.BoxSpec: profile, image, limits, env
	AnnState          = annPrefix + "state"
	AnnStateReason    = annPrefix + "state-reason"
	AnnDesiredState   = annPrefix + "desired-state"
	AnnLatestCkpt     = annPrefix + "latest-checkpoint"
	AnnAutostopSec    = annPrefix + "autostop-sec"
	AnnTTLSec         = annPrefix + "ttl-sec"
	AnnCreatedAt      = annPrefix + "created-at"
	AnnStateChangedAt = annPrefix + "state-changed-at"
	AnnRecordExtra    = annPrefix + "annotations" // JSON of Record.Annotations
	// AnnLabels is the JSON of Record.Labels, the record's copy of the sandbox's labels (the
	// truth: the PVC's and pod's labels mirror it, beside the driver's own).
	AnnLabels  = annPrefix + "labels"
	AnnPool    = annPrefix + "pool"    // Record.Pool: the warm pool that holds the box
	AnnCompute = annPrefix + "compute" // driver-owned: "running" while a pod should exist
	// AnnTampered (driver-owned) says why the box's pod was deleted after its attach channel
	// was found tampered with: the box is failed (not lost) until it is started again.
	AnnTampered = annPrefix + "channel-tampered"
	// AnnChannelKey (on a pod whose image carries the init) is the pod's channel key, which
	// the box's first attach brings to PID 1 (proto.ConnectProvision); AnnChannelReady says
	// that attach succeeded, so no later attach of the pod sends the key again.
	AnnChannelKey   = annPrefix + "channel-key"
	AnnChannelReady = annPrefix + "channel-ready"
	// AnnFence (driver-owned) is the highest fence a write to the box has carried
	// (runtime.WithFence), in decimal; a write with a lower one is refused.
	AnnFence           = annPrefix + "fence"
	computeRunning     = "running"
	computeStopped     = "stopped"
	containerName      = "sandbox"
	initContainerName  = "install-init"
	initVolume         = "sbx"
	runVolume          = "sbx-run"
	runDir             = "/run/sbx"
	workspaceVolume    = "workspace"
	initDir            = "/.sbx"
	initPath           = initDir + "/init"
	spawnerPath        = initDir + "/spawn"
	connectPath        = initDir + "/connect"
	workspacePath      = "/workspace"
	defaultDiskBytes   = 1 << 30
	terminationGraceSc = 5
)

// idPattern is the project's box id: a prefix, "_" and a 26-character ULID.
var idPattern = regexp.MustCompile(`^[a-z]{2,8}_[0-9A-HJKMNP-TV-Z]{26}$`)

// ObjectName is the name of a box's pod and PVC: its id in lower case with "-" for "_"
// (sbx_01J… → sbx-01j…), a valid DNS label.
func ObjectName(id string) (string, error) {
	if !idPattern.MatchString(id) {
		return "", fmt.Errorf("kube: invalid box id %q: %w", id, runtime.ErrNotFound)
	}
	return strings.ToLower(strings.ReplaceAll(id, "_", "-")), nil
}

// labelValue makes v a valid label value: kept as is when valid, otherwise every character
// outside [A-Za-z0-9._-] becomes "-", cut to 63 and trimmed to start and end alphanumeric.
func labelValue(v string) string {
	if len(validation.IsValidLabelValue(v)) == 0 {
		return v
	}
	b := []byte(v)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	if len(b) > validation.LabelValueMaxLength {
		b = b[:validation.LabelValueMaxLength]
	}
	isAlnum := func(r rune) bool {
		return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
	}
	return strings.TrimFunc(string(b), func(r rune) bool { return !isAlnum(r) })
}

// boxLabels are the labels of a box's PVC and pod: the record's labels (the caller's, which
// the domain keeps out of the driver's keys) and the driver's own, which win.
func boxLabels(rec runtime.Record) map[string]string {
	l := make(map[string]string, len(rec.Labels)+5)
	for k, v := range rec.Labels {
		if !ownLabel(k) {
			l[k] = v
		}
	}
	maps.Copy(l, map[string]string{
		LabelManagedBy: managedBy,
		LabelSandboxID: rec.ID,
		LabelTenant:    labelValue(rec.Tenant),
		LabelProject:   labelValue(rec.Project),
		LabelProfile:   labelValue(rec.Spec.Profile),
	})
	if rec.Pool != "" {
		l[LabelPool] = labelValue(rec.Pool)
	}
	return l
}

// ownLabel reports a label key that is the driver's own (or Kubernetes'): a record's label
// with such a key is never put on an object, nor removed from one.
func ownLabel(k string) bool {
	prefix, _, ok := strings.Cut(k, "/")
	if !ok {
		return false
	}
	for _, d := range []string{"sandboxd.io", "kubernetes.io", "k8s.io"} {
		if prefix == d || strings.HasSuffix(prefix, "."+d) {
			return true
		}
	}
	return false
}

// mirrorLabels makes an object's labels (meta) carry the record's labels next: keys of prev
// (the record's labels before) that next no longer has are removed; the driver's own keys
// are never touched. It reports whether meta changed.
func mirrorLabels(meta, prev, next map[string]string) bool {
	changed := false
	for k := range prev {
		if _, keep := next[k]; !keep && !ownLabel(k) {
			if _, ok := meta[k]; ok {
				delete(meta, k)
				changed = true
			}
		}
	}
	for k, v := range next {
		if old, ok := meta[k]; !ownLabel(k) && (!ok || old != v) {
			meta[k] = v
			changed = true
		}
	}
	return changed
}

// encodeRecord writes rec into annotations (replacing the record's own keys, keeping others).
func encodeRecord(ann map[string]string, rec runtime.Record) error {
	spec, err := json.Marshal(rec.Spec)
	if err != nil {
		return err
	}
	set := func(k, v string) {
		if v == "" {
			delete(ann, k)
		} else {
			ann[k] = v
		}
	}
	set(AnnTenant, rec.Tenant)
	set(AnnProject, rec.Project)
	set(AnnSpec, string(spec))
	set(AnnState, rec.State)
	set(AnnStateReason, rec.StateReason)
	set(AnnDesiredState, rec.DesiredState)
	set(AnnLatestCkpt, rec.LatestCheckpoint)
	set(AnnPool, rec.Pool)
	set(AnnAutostopSec, formatInt(rec.AutostopSec))
	set(AnnTTLSec, formatInt(rec.TTLSec))
	set(AnnCreatedAt, formatTime(rec.CreatedAt))
	set(AnnStateChangedAt, formatTime(rec.StateChangedAt))
	extra := ""
	if len(rec.Annotations) > 0 {
		b, err := json.Marshal(rec.Annotations)
		if err != nil {
			return err
		}
		extra = string(b)
	}
	set(AnnRecordExtra, extra)
	labels := ""
	if len(rec.Labels) > 0 {
		b, err := json.Marshal(rec.Labels)
		if err != nil {
			return err
		}
		labels = string(b)
	}
	set(AnnLabels, labels)
	return nil
}

// decodeRecord reads the record of the box whose PVC has these labels and annotations.
func decodeRecord(labels, ann map[string]string) (runtime.Record, error) {
	rec := runtime.Record{
		ID:               labels[LabelSandboxID],
		Tenant:           ann[AnnTenant],
		Project:          ann[AnnProject],
		State:            ann[AnnState],
		StateReason:      ann[AnnStateReason],
		DesiredState:     ann[AnnDesiredState],
		LatestCheckpoint: ann[AnnLatestCkpt],
		Pool:             ann[AnnPool],
	}
	if rec.ID == "" {
		return rec, fmt.Errorf("no %s label", LabelSandboxID)
	}
	if err := json.Unmarshal([]byte(ann[AnnSpec]), &rec.Spec); err != nil {
		return rec, fmt.Errorf("annotation %s: %w", AnnSpec, err)
	}
	var err error
	if rec.AutostopSec, err = parseInt(ann[AnnAutostopSec]); err != nil {
		return rec, fmt.Errorf("annotation %s: %w", AnnAutostopSec, err)
	}
	if rec.TTLSec, err = parseInt(ann[AnnTTLSec]); err != nil {
		return rec, fmt.Errorf("annotation %s: %w", AnnTTLSec, err)
	}
	if rec.CreatedAt, err = parseTime(ann[AnnCreatedAt]); err != nil {
		return rec, fmt.Errorf("annotation %s: %w", AnnCreatedAt, err)
	}
	if rec.StateChangedAt, err = parseTime(ann[AnnStateChangedAt]); err != nil {
		return rec, fmt.Errorf("annotation %s: %w", AnnStateChangedAt, err)
	}
	if v := ann[AnnRecordExtra]; v != "" {
		if err := json.Unmarshal([]byte(v), &rec.Annotations); err != nil {
			return rec, fmt.Errorf("annotation %s: %w", AnnRecordExtra, err)
		}
	}
	if v := ann[AnnLabels]; v != "" {
		if err := json.Unmarshal([]byte(v), &rec.Labels); err != nil {
			return rec, fmt.Errorf("annotation %s: %w", AnnLabels, err)
		}
	}
	return rec, nil
}

func formatInt(v int64) string {
	if v == 0 {
		return ""
	}
	return strconv.FormatInt(v, 10)
}

func parseInt(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	return time.Parse(time.RFC3339Nano, s)
}

// podSettings are the driver-wide parts of a box's pod.
type podSettings struct {
	namespace    string
	initImage    string
	runtimeClass string
	storageClass string
	// dnsPeer is the cluster DNS's pods, where an egress box's DNS may go.
	dnsPeer DNSPeer
}

// fenceOf is the fence a box's PVC records (0: none, or one that does not parse, which any
// fenced write then replaces).
func fenceOf(pvc *corev1.PersistentVolumeClaim) uint64 {
	n, _ := strconv.ParseUint(pvc.Annotations[AnnFence], 10, 64)
	return n
}

// admitFence checks a write made with ctx against the fence pvc records and, when the write's
// fence is higher, sets it on pvc (for the caller's update, whose resourceVersion makes the
// check and the change one step). raised reports that pvc changed.
func admitFence(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (raised bool, err error) {
	fence, raised, err := runtime.AdmitFence(ctx, fenceOf(pvc))
	if raised {
		pvc.Annotations[AnnFence] = strconv.FormatUint(fence, 10)
	}
	return raised, err
}

// newPVC is the workspace claim of a box, carrying its record.
func (s podSettings) newPVC(name string, rec runtime.Record) (*corev1.PersistentVolumeClaim, error) {
	ann := map[string]string{AnnCompute: computeRunning}
	if err := encodeRecord(ann, rec); err != nil {
		return nil, err
	}
	disk := rec.Spec.DiskBytes
	if disk <= 0 {
		disk = defaultDiskBytes
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.namespace, Labels: boxLabels(rec), Annotations: ann},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(disk, resource.BinarySI)},
			},
		},
	}
	if s.storageClass != "" {
		pvc.Spec.StorageClassName = &s.storageClass
	}
	return pvc, nil
}

// newPod is a box's compute: the guest init is PID 1 of the sandbox container over the
// profile's image, the image's own /.sbx/init when it carries one (spec.ImageHasInit), else put
// into an emptyDir by an init container; the workspace is the PVC.
func (s podSettings) newPod(name string, rec runtime.Record) (*corev1.Pod, error) {
	spec := rec.Spec
	if spec.Image == "" {
		return nil, fmt.Errorf("kube: profile %q names no image (profiles[].image)", spec.Profile)
	}
	if !spec.ImageHasInit && s.initImage == "" {
		return nil, fmt.Errorf("kube: profile %q: its image does not carry the guest init (image_has_init false) and no init image is set (kube.init_image)", spec.Profile)
	}
	env := make([]corev1.EnvVar, 0, len(spec.Env))
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		env = append(env, corev1.EnvVar{Name: k, Value: spec.Env[k]})
	}
	res := corev1.ResourceRequirements{Limits: corev1.ResourceList{}, Requests: corev1.ResourceList{}}
	if spec.MilliCPU > 0 {
		res.Limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(spec.MilliCPU, resource.DecimalSI)
		// Sandboxes idle most of their life: they ask for a tenth of their CPU limit.
		res.Requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(max(spec.MilliCPU/10, 10), resource.DecimalSI)
	}
	if spec.MemoryBytes > 0 {
		res.Limits[corev1.ResourceMemory] = *resource.NewQuantity(spec.MemoryBytes, resource.BinarySI)
		// Memory is not compressible: requested in full, so a node never evicts a sandbox for
		// memory it was promised.
		res.Requests[corev1.ResourceMemory] = *resource.NewQuantity(spec.MemoryBytes, resource.BinarySI)
	}
	no, grace := false, int64(terminationGraceSc)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.namespace, Labels: boxLabels(rec)},
		Spec: corev1.PodSpec{
			RuntimeClassName:              &s.runtimeClass,
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			TerminationGracePeriodSeconds: &grace,
			// The sandbox's own kernel is gVisor; its processes run as the image's root
			// user inside it, with no privilege escalation on the host side.
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			// The init container puts the guest init into the shared folder and the channel
			// key (a new one for every pod) into the run folder, where PID 1 takes and deletes
			// it before any command runs. The key lives in this container's spec only: the
			// sandbox container's processes (and `kubectl exec`s into it) never carry it.
			InitContainers: []corev1.Container{{
				Name:    initContainerName,
				Image:   s.initImage,
				Command: []string{"/sandbox-init", "install", initPath},
				Env: []corev1.EnvVar{
					{Name: proto.ChannelKeyEnv, Value: proto.EncodeChannelKey(proto.NewChannelKey())},
					{Name: proto.ChannelKeyFileEnv, Value: channelKeyFile},
				},
				VolumeMounts: []corev1.VolumeMount{
					{Name: initVolume, MountPath: initDir},
					{Name: runVolume, MountPath: runDir},
				},
				SecurityContext: containerSecurity(),
			}},
			Containers: []corev1.Container{{
				Name:       containerName,
				Image:      spec.Image,
				Command:    []string{initPath, "serve"},
				WorkingDir: workspacePath,
				// The spawner program beside the init (from the init image, or the image's
				// own): PID 1 starts the commands with it, or itself when there is none.
				Env: append(env, corev1.EnvVar{Name: proto.ChannelKeyFileEnv, Value: channelKeyFile},
					corev1.EnvVar{Name: proto.SpawnerEnv, Value: spawnerPath}),
				Resources: res,
				VolumeMounts: []corev1.VolumeMount{
					{Name: initVolume, MountPath: initDir, ReadOnly: true},
					{Name: runVolume, MountPath: runDir},
					{Name: workspaceVolume, MountPath: workspacePath},
				},
				SecurityContext: containerSecurity(),
			}},
			Volumes: []corev1.Volume{
				{Name: initVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: workspaceVolume, VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name},
				}},
				// The init's run folder (the channel key, then each exec's output log) in memory,
				// counted against the pod's memory like the local runtime's tmpfs.
				{Name: runVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
			},
		},
	}
	if spec.ImageHasInit {
		// No init container: the key is the pod's annotation, and PID 1 waits in the run
		// folder for the first attach to bring it (runPod, proto.ConnectProvision). Nothing of
		// the workload can run before PID 1 listens, which it does only once it has the key.
		key := proto.EncodeChannelKey(proto.NewChannelKey())
		pod.Annotations = map[string]string{AnnChannelKey: key}
		pod.Spec.InitContainers = nil
		c := &pod.Spec.Containers[0]
		c.Env = append(c.Env, corev1.EnvVar{Name: proto.ChannelKeyAwaitEnv, Value: "1"})
		c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == initVolume })
		pod.Spec.Volumes = slices.DeleteFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == initVolume })
	}
	if dns := podDNS(spec); dns != nil {
		// The pod asks the policy's resolvers (on a cluster, usually the cluster DNS's
		// Service address), without the cluster's search domains.
		pod.Spec.DNSPolicy, pod.Spec.DNSConfig = corev1.DNSNone, dns
	}
	return pod, nil
}

// channelKeyFile is where the init container writes the pod's channel key and PID 1 takes it.
const channelKeyFile = runDir + "/channel.key"

// freshUnlessProvisioned is the pod (from the watch's cache) when it is provisioned, else the
// API server's copy of it: the cache may trail the mark of the attach that brought the key. On
// a failed read the cached pod is kept.
func (d *Driver) freshUnlessProvisioned(ctx context.Context, name string, pod *corev1.Pod) *corev1.Pod {
	if provisioned(pod) {
		return pod
	}
	if fresh, err := d.cs.CoreV1().Pods(d.opts.Namespace).Get(ctx, name, metav1.GetOptions{}); err == nil {
		return fresh
	}
	return pod
}

// provisioned reports whether the pod's PID 1 has its channel key: always for a pod made with
// an init container, which wrote it; for one whose image carries the init, once its first
// attach brought it (AnnChannelReady).
func provisioned(pod *corev1.Pod) bool {
	_, awaits := pod.Annotations[AnnChannelKey]
	return !awaits || pod.Annotations[AnnChannelReady] == "true"
}

// podChannelKey is the channel key a box's pod was made with (its annotation when its image
// carries the init, else its init container's environment; the pod's spec never changes).
func podChannelKey(pod *corev1.Pod) ([]byte, error) {
	if k, ok := pod.Annotations[AnnChannelKey]; ok {
		return proto.ParseChannelKey(k)
	}
	for _, c := range pod.Spec.InitContainers {
		if c.Name != initContainerName {
			continue
		}
		for _, e := range c.Env {
			if e.Name == proto.ChannelKeyEnv {
				return proto.ParseChannelKey(e.Value)
			}
		}
	}
	return nil, fmt.Errorf("kube: pod %s has no channel key (made by an older sandboxd? start the sandbox again)", pod.Name)
}

func containerSecurity() *corev1.SecurityContext {
	no := false
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: &no,
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"NET_RAW"}},
	}
}
