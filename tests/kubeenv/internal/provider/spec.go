package provider

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"

	"sandboxd/tests/kubeenv/internal/engine"
	"sandboxd/tests/kubeenv/internal/runsc"
)

// Defaults of a container's process and limits (as the project's local driver sets them).
const (
	defaultPath     = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	pidsLimit       = 4096 // runsc counts host tasks (~20 per sandbox): a generous backstop
	cpuPeriodMicros = 100_000
	nofileLimit     = 65536
	shmBytes        = 64 << 20
)

// buildSpec returns the OCI config of a container, common to both runtimes. The root
// filesystem is the image's folder; unless the container asks for readOnlyRootFilesystem,
// runsc runs with --overlay2=root:memory, so writes outside volumes land in the sandbox's
// memory and the folder (shared by every container of that image) is never written. For
// runc, the engine's Prepare completes the spec (an overlay root in the bundle, masked and
// read-only paths, device cgroup, the cgroup under the node's parent; package runc). The
// pod's seccomp profile is applied by neither (runsc: gVisor is the sandbox; runc: see
// runc.CLI.Complete). Called with pr.mu held.
func (pr *podRuntime) buildSpec(c *ctr, rootfs string) (*runsc.Spec, error) {
	pod, cs := pr.pod, c.spec

	// Environment: defaults, then the container's variables in order (virtual-kubelet has
	// resolved valueFrom and $(VAR) references into Value).
	env := map[string]string{"PATH": defaultPath, "HOSTNAME": hostname(pod)}
	var order []string // the container's variables, first occurrence order
	fromContainer := map[string]bool{}
	for _, e := range cs.Env {
		if !fromContainer[e.Name] {
			fromContainer[e.Name] = true
			order = append(order, e.Name)
		}
		env[e.Name] = e.Value
	}
	uid, gid, groups := user(pod, &cs)
	if _, ok := env["HOME"]; !ok {
		env["HOME"] = "/"
		if uid == 0 {
			env["HOME"] = "/root"
		}
	}
	var envList []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if !fromContainer[k] {
			envList = append(envList, k+"="+env[k])
		}
	}
	for _, k := range order {
		envList = append(envList, k+"="+env[k])
	}

	// Command and args: $(VAR) references expand from the container's environment.
	mapping := expansion.MappingFuncFor(env)
	var args []string
	for _, a := range append(slices.Clone(cs.Command), cs.Args...) {
		args = append(args, expansion.Expand(a, mapping))
	}

	caps := capabilities(cs.SecurityContext)
	noNewPrivs := cs.SecurityContext != nil && cs.SecurityContext.AllowPrivilegeEscalation != nil && !*cs.SecurityContext.AllowPrivilegeEscalation
	readOnlyRoot := cs.SecurityContext != nil && cs.SecurityContext.ReadOnlyRootFilesystem != nil && *cs.SecurityContext.ReadOnlyRootFilesystem
	cwd := cs.WorkingDir
	if cwd == "" {
		cwd = "/"
	}

	mounts, err := pr.mounts(&cs)
	if err != nil {
		return nil, err
	}
	for _, m := range mounts {
		if m.Type == "bind" && pr.eng.Handler() == engine.Runsc {
			if _, err := os.Lstat(filepath.Join(rootfs, m.Destination)); err != nil {
				// runsc creates a missing bind mount point in the image folder itself.
				pr.p.log.Debug("mount point missing in image: runsc creates it in the image folder",
					"pod", pr.key, "container", cs.Name, "path", m.Destination, "image", cs.Image)
			}
		}
	}

	res := &runsc.Resources{Pids: &runsc.Pids{Limit: pidsLimit}}
	if q, ok := cs.Resources.Limits[corev1.ResourceMemory]; ok && q.Value() > 0 {
		res.Memory = &runsc.Memory{Limit: q.Value()}
	}
	if q, ok := cs.Resources.Limits[corev1.ResourceCPU]; ok && q.MilliValue() > 0 {
		res.CPU = &runsc.CPU{Quota: max(q.MilliValue()*cpuPeriodMicros/1000, 1000), Period: cpuPeriodMicros}
	}

	return &runsc.Spec{
		Version: "1.0.2",
		Root:    runsc.Root{Path: rootfs, Readonly: readOnlyRoot},
		Process: runsc.Process{
			User:            runsc.User{UID: uid, GID: gid, AdditionalGids: groups},
			Args:            args,
			Env:             envList,
			Cwd:             cwd,
			Capabilities:    runsc.Capabilities{Bounding: caps, Effective: caps, Permitted: caps},
			Rlimits:         []runsc.Rlimit{{Type: "RLIMIT_NOFILE", Hard: nofileLimit, Soft: nofileLimit}},
			NoNewPrivileges: noNewPrivs,
		},
		Hostname: hostname(pod),
		Mounts:   mounts,
		Linux: runsc.Linux{
			Namespaces: []runsc.Namespace{{Type: "pid"}, {Type: "network"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}},
			Resources:  res,
			// Named explicitly (runsc's default too): the exit watcher reads the memory
			// cgroup's OOM counter there, the teardown removes what runsc leaves.
			CgroupsPath: "/" + c.id,
		},
	}, nil
}

// mounts returns the container's mounts: the system mounts the project's local driver uses
// (/proc, /dev, /dev/pts, /dev/shm, /sys read-only, /tmp tmpfs; those a volume replaces are
// left out), then its volume mounts, parents before children. Called with pr.mu held.
func (pr *podRuntime) mounts(cs *corev1.Container) ([]runsc.Mount, error) {
	volumeAt := map[string]bool{}
	for _, vm := range cs.VolumeMounts {
		volumeAt[filepath.Clean(vm.MountPath)] = true
	}
	system := []runsc.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", fmt.Sprintf("size=%d", shmBytes)}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
	}
	var out []runsc.Mount
	for _, m := range system {
		if !volumeAt[m.Destination] {
			out = append(out, m)
		}
	}
	var binds []runsc.Mount
	for _, vm := range cs.VolumeMounts {
		v, ok := pr.volumes[vm.Name]
		if !ok {
			return nil, fmt.Errorf("container %s: volume mount %q names no volume of the pod", cs.Name, vm.Name)
		}
		if !filepath.IsAbs(vm.MountPath) {
			return nil, fmt.Errorf("container %s: mount path %q is not absolute", cs.Name, vm.MountPath)
		}
		if vm.SubPathExpr != "" {
			return nil, fmt.Errorf("container %s: volume mount %q: subPathExpr is not supported by this node", cs.Name, vm.Name)
		}
		src := v.path
		if vm.SubPath != "" {
			sub := filepath.Clean(vm.SubPath)
			if filepath.IsAbs(sub) || sub == ".." || strings.HasPrefix(sub, "../") {
				return nil, fmt.Errorf("container %s: volume mount %q: subPath %q must be relative and stay inside the volume", cs.Name, vm.Name, vm.SubPath)
			}
			src = filepath.Join(v.path, sub)
			if _, err := os.Lstat(src); os.IsNotExist(err) {
				if err := os.MkdirAll(src, 0o755); err != nil {
					return nil, fmt.Errorf("container %s: subPath %q: %w", cs.Name, vm.SubPath, err)
				}
			}
		}
		mode := "rw"
		if vm.ReadOnly || v.readOnly {
			mode = "ro"
		}
		binds = append(binds, runsc.Mount{Destination: filepath.Clean(vm.MountPath), Type: "bind", Source: src, Options: []string{"rbind", mode}})
	}
	slices.SortStableFunc(binds, func(a, b runsc.Mount) int {
		return strings.Count(a.Destination, "/") - strings.Count(b.Destination, "/")
	})
	return append(out, binds...), nil
}

// user returns the uid, gid and supplementary groups of a container (container security
// context over the pod's; root by default: images have no user metadata).
func user(pod *corev1.Pod, cs *corev1.Container) (uid, gid uint32, groups []uint32) {
	if psc := pod.Spec.SecurityContext; psc != nil {
		if psc.RunAsUser != nil {
			uid = uint32(*psc.RunAsUser)
		}
		if psc.RunAsGroup != nil {
			gid = uint32(*psc.RunAsGroup)
		}
		for _, g := range psc.SupplementalGroups {
			groups = append(groups, uint32(g))
		}
		if psc.FSGroup != nil {
			groups = append(groups, uint32(*psc.FSGroup))
		}
	}
	if sc := cs.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = uint32(*sc.RunAsUser)
		}
		if sc.RunAsGroup != nil {
			gid = uint32(*sc.RunAsGroup)
		}
	}
	return uid, gid, groups
}

// capabilities returns Docker's default set with the security context's adds and drops.
func capabilities(sc *corev1.SecurityContext) []string {
	caps := slices.Clone(runsc.DockerCaps)
	if sc == nil || sc.Capabilities == nil {
		return caps
	}
	norm := func(c corev1.Capability) string {
		s := strings.ToUpper(string(c))
		if !strings.HasPrefix(s, "CAP_") {
			s = "CAP_" + s
		}
		return s
	}
	for _, d := range sc.Capabilities.Drop {
		if strings.EqualFold(string(d), "ALL") {
			caps = nil
			break
		}
		caps = slices.DeleteFunc(caps, func(c string) bool { return c == norm(d) })
	}
	for _, a := range sc.Capabilities.Add {
		if n := norm(a); !slices.Contains(caps, n) {
			caps = append(caps, n)
		}
	}
	return caps
}

// hostname is the pod's hostname (spec.hostname, else its name), at most 63 characters.
func hostname(pod *corev1.Pod) string {
	h := pod.Spec.Hostname
	if h == "" {
		h = pod.Name
	}
	if len(h) > 63 {
		h = strings.TrimRight(h[:63], "-.")
	}
	return h
}

// writeJSON writes v as JSON to path through a temporary file.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
