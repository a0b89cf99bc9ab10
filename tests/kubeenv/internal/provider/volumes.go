package provider

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// hostVolume is a pod volume as a host folder that containers bind-mount.
type hostVolume struct {
	path     string
	readOnly bool
}

// Reasons of a pod that failed on its volumes.
const (
	reasonUnsupportedVolume = "UnsupportedVolume"
	reasonVolumeError       = "VolumeError"
)

// pvcBindTimeout bounds the wait for a pod's PVC to be bound (the scheduler normally only
// places pods whose claims are bound).
const pvcBindTimeout = 2 * time.Minute

// prepareVolumes makes every volume of the pod a host folder. It returns the reason of the
// pod's failure with the error.
func (pr *podRuntime) prepareVolumes(ctx context.Context) (map[string]hostVolume, string, error) {
	pr.mu.Lock()
	pod := pr.pod.DeepCopy()
	pr.mu.Unlock()
	vols := map[string]hostVolume{}
	for _, v := range pod.Spec.Volumes {
		if strings.ContainsAny(v.Name, "/\x00") || v.Name == "." || v.Name == ".." {
			return nil, reasonVolumeError, fmt.Errorf("volume %q: invalid name", v.Name)
		}
		dir := filepath.Join(pr.dir, "volumes", v.Name)
		var (
			hv  hostVolume
			err error
		)
		switch {
		case v.EmptyDir != nil:
			// World-writable like the kubelet's, for containers that run as another user.
			if err = os.MkdirAll(dir, 0o777); err == nil {
				err = os.Chmod(dir, 0o777)
			}
			hv = hostVolume{path: dir}
		case v.PersistentVolumeClaim != nil:
			hv, err = pr.claimVolume(ctx, v.PersistentVolumeClaim)
		case v.HostPath != nil:
			hv, err = hostPathVolume(v.HostPath)
		case v.ConfigMap != nil, v.Secret != nil, v.DownwardAPI != nil, v.Projected != nil:
			var files map[string]fileData
			files, err = pr.projectedFiles(ctx, pod, &v)
			if err == nil {
				err = writeFiles(dir, files)
			}
			hv = hostVolume{path: dir, readOnly: true}
		default:
			return nil, reasonUnsupportedVolume, fmt.Errorf("volume %q: this kind of volume is not supported by the kubeenv node (supported: emptyDir, persistentVolumeClaim, hostPath, configMap, secret, downwardAPI, projected)", v.Name)
		}
		if err != nil {
			return nil, reasonVolumeError, fmt.Errorf("volume %q: %w", v.Name, err)
		}
		vols[v.Name] = hv
	}
	return vols, "", nil
}

// claimVolume resolves a PVC to its bound PV's host folder (hostPath.path or local.path),
// waiting (watch) while the claim is not bound yet.
func (pr *podRuntime) claimVolume(ctx context.Context, src *corev1.PersistentVolumeClaimVolumeSource) (hostVolume, error) {
	pvc, err := pr.waitBound(ctx, src.ClaimName)
	if err != nil {
		return hostVolume{}, err
	}
	pv, err := pr.p.cfg.Client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return hostVolume{}, fmt.Errorf("claim %s: persistent volume %s: %w", src.ClaimName, pvc.Spec.VolumeName, err)
	}
	var path string
	switch {
	case pv.Spec.HostPath != nil:
		path = pv.Spec.HostPath.Path
	case pv.Spec.Local != nil:
		path = pv.Spec.Local.Path
	default:
		return hostVolume{}, fmt.Errorf("claim %s: persistent volume %s is neither hostPath nor local: this node cannot mount it", src.ClaimName, pv.Name)
	}
	if fi, err := os.Stat(path); err != nil || !fi.IsDir() {
		return hostVolume{}, fmt.Errorf("claim %s: persistent volume %s: folder %s is missing on this host", src.ClaimName, pv.Name, path)
	}
	return hostVolume{path: path, readOnly: src.ReadOnly}, nil
}

// waitBound returns the claim once it is bound, watching it for up to pvcBindTimeout.
func (pr *podRuntime) waitBound(ctx context.Context, name string) (*corev1.PersistentVolumeClaim, error) {
	ctx, cancel := context.WithTimeout(ctx, pvcBindTimeout)
	defer cancel()
	pvcs := pr.p.cfg.Client.CoreV1().PersistentVolumeClaims(pr.namespace)
	bound := func(c *corev1.PersistentVolumeClaim) bool {
		return c.Spec.VolumeName != "" && c.Status.Phase == corev1.ClaimBound
	}
	for {
		pvc, err := pvcs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("persistent volume claim %q not found", name)
			}
			return nil, fmt.Errorf("persistent volume claim %q: %w", name, err)
		}
		if bound(pvc) {
			return pvc, nil
		}
		w, err := pvcs.Watch(ctx, metav1.ListOptions{
			FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
			ResourceVersion: pvc.ResourceVersion,
		})
		if err != nil {
			return nil, fmt.Errorf("persistent volume claim %q is not bound and cannot be watched: %w", name, err)
		}
		for ev := range w.ResultChan() {
			if c, ok := ev.Object.(*corev1.PersistentVolumeClaim); ok && ev.Type != watch.Deleted && bound(c) {
				w.Stop()
				return c, nil
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("persistent volume claim %q is not bound: %w", name, ctx.Err())
		}
	}
}

// hostPathVolume checks (or makes, for the *OrCreate types) a hostPath volume's path.
func hostPathVolume(src *corev1.HostPathVolumeSource) (hostVolume, error) {
	path := filepath.Clean(src.Path)
	if !filepath.IsAbs(path) {
		return hostVolume{}, fmt.Errorf("hostPath %q is not absolute", src.Path)
	}
	typ := corev1.HostPathUnset
	if src.Type != nil {
		typ = *src.Type
	}
	fi, statErr := os.Stat(path)
	switch typ {
	case corev1.HostPathDirectoryOrCreate:
		if statErr != nil {
			if err := os.MkdirAll(path, 0o755); err != nil {
				return hostVolume{}, err
			}
		}
	case corev1.HostPathFileOrCreate:
		if statErr != nil {
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return hostVolume{}, err
			}
			f.Close()
		}
	case corev1.HostPathDirectory:
		if statErr != nil || !fi.IsDir() {
			return hostVolume{}, fmt.Errorf("hostPath %s is not a folder", path)
		}
	case corev1.HostPathFile:
		if statErr != nil || !fi.Mode().IsRegular() {
			return hostVolume{}, fmt.Errorf("hostPath %s is not a file", path)
		}
	case corev1.HostPathUnset:
	default:
		if statErr != nil {
			return hostVolume{}, fmt.Errorf("hostPath %s: %w", path, statErr)
		}
	}
	return hostVolume{path: path}, nil
}

// fileData is one file of a configMap, secret, downwardAPI or projected volume.
type fileData struct {
	data []byte
	mode os.FileMode
}

// projectedFiles computes the files of a configMap, secret, downwardAPI or projected volume.
func (pr *podRuntime) projectedFiles(ctx context.Context, pod *corev1.Pod, v *corev1.Volume) (map[string]fileData, error) {
	files := map[string]fileData{}
	switch {
	case v.ConfigMap != nil:
		return files, pr.configMapFiles(ctx, files, &v.ConfigMap.LocalObjectReference, v.ConfigMap.Items, v.ConfigMap.Optional, v.ConfigMap.DefaultMode)
	case v.Secret != nil:
		return files, pr.secretFiles(ctx, files, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional, v.Secret.DefaultMode)
	case v.DownwardAPI != nil:
		return files, downwardFiles(files, pod, v.DownwardAPI.Items, v.DownwardAPI.DefaultMode)
	}
	p := v.Projected
	for _, s := range p.Sources {
		var err error
		switch {
		case s.ConfigMap != nil:
			err = pr.configMapFiles(ctx, files, &s.ConfigMap.LocalObjectReference, s.ConfigMap.Items, s.ConfigMap.Optional, p.DefaultMode)
		case s.Secret != nil:
			err = pr.secretFiles(ctx, files, s.Secret.Name, s.Secret.Items, s.Secret.Optional, p.DefaultMode)
		case s.DownwardAPI != nil:
			err = downwardFiles(files, pod, s.DownwardAPI.Items, p.DefaultMode)
		case s.ServiceAccountToken != nil:
			err = pr.tokenFile(ctx, files, pod, s.ServiceAccountToken, p.DefaultMode)
		default:
			err = errors.New("projected source kind not supported by this node (supported: configMap, secret, downwardAPI, serviceAccountToken)")
		}
		if err != nil {
			return nil, err
		}
	}
	return files, nil
}

func fileMode(itemMode, defaultMode *int32) os.FileMode {
	switch {
	case itemMode != nil:
		return os.FileMode(*itemMode) & 0o777
	case defaultMode != nil:
		return os.FileMode(*defaultMode) & 0o777
	}
	return 0o644
}

// keyFiles adds the files of a key/value source (all keys, or the listed items).
func keyFiles(files map[string]fileData, kind, name string, data map[string][]byte, items []corev1.KeyToPath, optional *bool, defaultMode *int32) error {
	if len(items) == 0 {
		for k, b := range data {
			files[k] = fileData{data: b, mode: fileMode(nil, defaultMode)}
		}
		return nil
	}
	for _, it := range items {
		b, ok := data[it.Key]
		if !ok {
			if optional != nil && *optional {
				continue
			}
			return fmt.Errorf("%s %s has no key %q", kind, name, it.Key)
		}
		files[it.Path] = fileData{data: b, mode: fileMode(it.Mode, defaultMode)}
	}
	return nil
}

func (pr *podRuntime) configMapFiles(ctx context.Context, files map[string]fileData, ref *corev1.LocalObjectReference, items []corev1.KeyToPath, optional *bool, defaultMode *int32) error {
	cm, err := pr.p.cfg.Client.CoreV1().ConfigMaps(pr.namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) && optional != nil && *optional {
			return nil
		}
		return fmt.Errorf("configMap %s: %w", ref.Name, err)
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return keyFiles(files, "configMap", ref.Name, data, items, optional, defaultMode)
}

func (pr *podRuntime) secretFiles(ctx context.Context, files map[string]fileData, name string, items []corev1.KeyToPath, optional *bool, defaultMode *int32) error {
	s, err := pr.p.cfg.Client.CoreV1().Secrets(pr.namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) && optional != nil && *optional {
			return nil
		}
		return fmt.Errorf("secret %s: %w", name, err)
	}
	return keyFiles(files, "secret", name, s.Data, items, optional, defaultMode)
}

// downwardFiles adds the files of downwardAPI items (fieldRef only).
func downwardFiles(files map[string]fileData, pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile, defaultMode *int32) error {
	for _, it := range items {
		if it.FieldRef == nil {
			return fmt.Errorf("downwardAPI item %q: only fieldRef is supported by this node", it.Path)
		}
		val, err := fieldValue(pod, it.FieldRef.FieldPath)
		if err != nil {
			return fmt.Errorf("downwardAPI item %q: %w", it.Path, err)
		}
		files[it.Path] = fileData{data: []byte(val), mode: fileMode(it.Mode, defaultMode)}
	}
	return nil
}

// fieldValue resolves a downward API field path of the pod.
func fieldValue(pod *corev1.Pod, path string) (string, error) {
	formatMap := func(m map[string]string) string {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var b strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&b, "%s=%q\n", k, m[k])
		}
		return b.String()
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.podIP":
		return "127.0.0.1", nil
	}
	for prefix, m := range map[string]map[string]string{"metadata.labels['": pod.Labels, "metadata.annotations['": pod.Annotations} {
		if strings.HasPrefix(path, prefix) && strings.HasSuffix(path, "']") {
			return m[strings.TrimSuffix(strings.TrimPrefix(path, prefix), "']")], nil
		}
	}
	return "", fmt.Errorf("field %q is not supported by this node", path)
}

// tokenFile requests a service account token bound to the pod.
func (pr *podRuntime) tokenFile(ctx context.Context, files map[string]fileData, pod *corev1.Pod, src *corev1.ServiceAccountTokenProjection, defaultMode *int32) error {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: src.ExpirationSeconds,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if src.Audience != "" {
		req.Spec.Audiences = []string{src.Audience}
	}
	tr, err := pr.p.cfg.Client.CoreV1().ServiceAccounts(pr.namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("service account token for %s: %w", sa, err)
	}
	files[src.Path] = fileData{data: []byte(tr.Status.Token), mode: fileMode(nil, defaultMode)}
	return nil
}

// writeFiles writes a volume's files under dir (relative paths that stay inside it).
func writeFiles(dir string, files map[string]fileData) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for rel, f := range files {
		clean := filepath.Clean(rel)
		if filepath.IsAbs(clean) || clean == "." || clean == ".." || strings.HasPrefix(clean, "../") {
			return fmt.Errorf("file path %q must be relative and stay inside the volume", rel)
		}
		p := filepath.Join(dir, clean)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, f.data, f.mode); err != nil {
			return err
		}
		if err := os.Chmod(p, f.mode); err != nil {
			return err
		}
	}
	return nil
}
