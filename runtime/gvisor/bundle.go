package gvisor

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"sandboxd/guest/proto"
	"sandboxd/internal/netpolicy"
	"sandboxd/runtime"
)

// The subset of the OCI runtime spec (v1.0.2) the driver writes. Written here rather than
// imported so the module does not take the runtime-spec dependency for a dozen structs.
type ociSpec struct {
	Version  string     `json:"ociVersion"`
	Root     ociRoot    `json:"root"`
	Process  ociProcess `json:"process"`
	Hostname string     `json:"hostname,omitempty"`
	Mounts   []ociMount `json:"mounts"`
	Linux    ociLinux   `json:"linux"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociProcess struct {
	Terminal        bool            `json:"terminal"`
	User            ociUser         `json:"user"`
	Args            []string        `json:"args"`
	Env             []string        `json:"env"`
	Cwd             string          `json:"cwd"`
	Capabilities    ociCapabilities `json:"capabilities"`
	Rlimits         []ociRlimit     `json:"rlimits"`
	NoNewPrivileges bool            `json:"noNewPrivileges"`
}

type ociUser struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type ociCapabilities struct {
	Bounding    []string `json:"bounding"`
	Effective   []string `json:"effective"`
	Permitted   []string `json:"permitted"`
	Inheritable []string `json:"inheritable,omitempty"`
}

type ociRlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	Namespaces  []ociNamespace `json:"namespaces"`
	Resources   *ociResources  `json:"resources,omitempty"`
	CgroupsPath string         `json:"cgroupsPath,omitempty"`
}

type ociNamespace struct {
	Type string `json:"type"`
	Path string `json:"path,omitempty"`
}

// boxNetwork is what a box with egress runs in: the network namespace the driver made and the
// resolv.conf naming its policy's resolvers (network.go). Zero for a box without network.
type boxNetwork struct {
	netns      string
	resolvConf string
}

// resolvConfFile is a box with egress's resolv.conf in its folder, mounted read-only over the
// base's /etc/resolv.conf.
const resolvConfFile = "resolv.conf"

// resolvConf lists a policy's resolvers, the only ones the box may query.
func resolvConf(p *runtime.NetworkPolicy) []byte {
	var b strings.Builder
	b.WriteString("# the sandbox's network policy allows DNS to these resolvers only\n")
	for _, a := range netpolicy.DNSAddrs(p) {
		b.WriteString("nameserver " + a.String() + "\n")
	}
	b.WriteString("options timeout:2 attempts:2\n")
	return []byte(b.String())
}

type ociResources struct {
	Memory *ociMemory `json:"memory,omitempty"`
	CPU    *ociCPU    `json:"cpu,omitempty"`
	Pids   *ociPids   `json:"pids,omitempty"`
}

type ociMemory struct {
	Limit int64 `json:"limit"`
}

type ociCPU struct {
	Quota  int64  `json:"quota"`
	Period uint64 `json:"period"`
}

type ociPids struct {
	Limit int64 `json:"limit"`
}

// Defaults of the box's process and limits.
const (
	// DefaultPidsLimit is the pids cgroup backstop when the spec sets none. runsc counts host
	// tasks (about 20 per sandbox plus about 2 per guest process), and exceeding it kills the
	// whole sandbox, so it is generous.
	DefaultPidsLimit = 4096
	cpuPeriodMicros  = 100_000
	nofileLimit      = 65536
	shmBytes         = 64 << 20
	defaultPath      = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// dockerCaps is Docker's default capability set: what every command in a box holds.
var dockerCaps = []string{
	"CAP_AUDIT_WRITE", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_MKNOD", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_SETFCAP", "CAP_SETGID", "CAP_SETPCAP",
	"CAP_SETUID", "CAP_SYS_CHROOT",
}

// initCaps is what PID 1 starts with: the commands' set plus CAP_SYS_ADMIN, which the guest
// init needs for a moment before any command runs (to hide its host socket's folder and open
// the exec cgroups) and then drops from every set on every thread (cmd/sandbox-init/setup.go).
// (It has to be in the bounding set too: runsc grants no capability outside it.) It is the
// sandbox's own CAP_SYS_ADMIN, inside gVisor's kernel, never the host's. The init refuses to
// serve when it cannot do all of that (proto.RequireContainmentEnv).
var initCaps = append(slices.Clone(dockerCaps), "CAP_SYS_ADMIN")

// buildSpec returns the OCI config of a box. initDir is the host folder holding only the guest
// init binary; it is mounted read-only at /.sbx, an existing folder of the rootfs, so that
// runsc never has to create a mount point in the shared rootfs (it would, on the host: a
// file bind at /.sbx/init leaves an empty /.sbx/init in the rootfs folder).
// hostDir, when not empty, is a host folder mounted at /run/sbx/host where the guest init
// finds its channel key (proto.ChannelKeyFileEnv, deleted once read) and creates its host
// socket (proto.HostSocketEnv); it then covers the folder with an empty read-only tmpfs, so no
// command of the box ever reaches it.
func buildSpec(id string, spec runtime.BoxSpec, workspace, initDir, hostDir string, spawner bool, nw boxNetwork) (*ociSpec, error) {
	if err := validateSpec(spec); err != nil {
		return nil, err
	}
	env := map[string]string{"PATH": defaultPath, "HOME": "/root", "LANG": "C.UTF-8"}
	maps.Copy(env, spec.Env)
	if hostDir != "" {
		env[proto.HostSocketEnv] = hostSocketInBox
		env[proto.ChannelKeyFileEnv] = channelKeyInBox
	}
	env[proto.RequireContainmentEnv] = "1"
	env[proto.StopSignalsEnv] = "0" // the driver ends a box with SIGKILL, never SIGTERM
	if spawner {
		env[proto.SpawnerEnv] = spawnerPathInBox
	}
	envList := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		envList = append(envList, k+"="+env[k])
	}

	res := &ociResources{Pids: &ociPids{Limit: DefaultPidsLimit}}
	if spec.PidsLimit > 0 {
		res.Pids.Limit = spec.PidsLimit
	}
	if spec.MemoryBytes > 0 {
		res.Memory = &ociMemory{Limit: spec.MemoryBytes}
	}
	if spec.MilliCPU > 0 {
		res.CPU = &ociCPU{Quota: max(spec.MilliCPU*cpuPeriodMicros/1000, 1000), Period: cpuPeriodMicros}
	}

	oci := &ociSpec{
		Version: "1.0.2",
		Root:    ociRoot{Path: spec.Rootfs, Readonly: true},
		Process: ociProcess{
			Args: []string{initPathInBox},
			Env:  envList,
			Cwd:  "/workspace",
			Capabilities: ociCapabilities{
				Bounding: initCaps, Effective: initCaps, Permitted: initCaps,
			},
			Rlimits:         []ociRlimit{{Type: "RLIMIT_NOFILE", Hard: nofileLimit, Soft: nofileLimit}},
			NoNewPrivileges: true,
		},
		Hostname: "sandbox",
		Mounts: []ociMount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", fmt.Sprintf("size=%d", shmBytes)}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
			{Destination: "/run/sbx", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=755"}},
			{Destination: "/workspace", Type: "bind", Source: workspace, Options: []string{"rbind", "rw"}},
			{Destination: initDirInBox, Type: "bind", Source: initDir, Options: []string{"rbind", "ro"}},
		},
		Linux: ociLinux{
			Namespaces: []ociNamespace{{Type: "pid"}, {Type: "network"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}},
			Resources:  res,
			// Named explicitly (it is runsc's default too) so the driver knows where to read
			// the memory cgroup's OOM counter and which stale cgroup to remove.
			CgroupsPath: cgroupPath(id),
		},
	}
	for i := range oci.Linux.Namespaces {
		if oci.Linux.Namespaces[i].Type == "network" {
			oci.Linux.Namespaces[i].Path = nw.netns
		}
	}
	if nw.resolvConf != "" {
		oci.Mounts = append(oci.Mounts, ociMount{Destination: "/etc/resolv.conf", Type: "bind", Source: nw.resolvConf, Options: []string{"rbind", "ro"}})
	}
	if hostDir != "" {
		// After /run/sbx's tmpfs, so the mount point is made in the tmpfs, never in the rootfs.
		oci.Mounts = append(oci.Mounts, ociMount{Destination: hostDirInBox, Type: "bind", Source: hostDir, Options: []string{"rbind", "rw"}})
	}
	return oci, nil
}

// Where the guest init lives inside a box.
const (
	// hostDirInBox is where the box's host folder is mounted; the init makes its host socket there.
	hostDirInBox    = "/run/sbx/host"
	hostSocketInBox = hostDirInBox + "/init.sock"
	channelKeyInBox = hostDirInBox + "/" + channelKeyName
	// channelKeyName is the key file's name in the host folder (and of the driver's own copy
	// in the box's folder).
	channelKeyName = "channel.key"
	initDirInBox   = "/.sbx"
	initPathInBox  = "/.sbx/init"
	// spawnerPathInBox is the spawner program, when the driver has one (Options.SpawnerBinary).
	spawnerPathInBox = "/.sbx/spawn"
)

func cgroupPath(id string) string { return "/" + id }

// connectProcess is the process spec of `runsc exec --process`: the guest init's `connect`
// relay, with no capability at all (the container's process spec would give it PID 1's) and
// nothing of the box's environment but PATH.
func connectProcess() ociProcess {
	return ociProcess{
		Args:            []string{initPathInBox, "connect"},
		Env:             []string{"PATH=" + defaultPath},
		Cwd:             "/",
		Capabilities:    ociCapabilities{Bounding: []string{}, Effective: []string{}, Permitted: []string{}},
		Rlimits:         []ociRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
		NoNewPrivileges: true,
	}
}

// validateSpec rejects what the local driver cannot build or what could smuggle options.
func validateSpec(spec runtime.BoxSpec) error {
	if spec.Rootfs == "" || !filepath.IsAbs(spec.Rootfs) || filepath.Clean(spec.Rootfs) == "/" {
		return fmt.Errorf("gvisor: spec rootfs %q must be an absolute path other than /", spec.Rootfs)
	}
	if _, err := networkFlag(spec); err != nil {
		return err
	}
	if spec.MemoryBytes < 0 || spec.MilliCPU < 0 || spec.PidsLimit < 0 {
		return fmt.Errorf("gvisor: negative limits in spec")
	}
	if spec.MemoryBytes > 0 && spec.MemoryBytes < 32<<20 {
		return fmt.Errorf("gvisor: memory limit %d bytes is below the 32 MiB a sandbox needs", spec.MemoryBytes)
	}
	for k, v := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("gvisor: invalid environment variable %q", k)
		}
		// The guest init reads its own settings (SBX_SOCKET, SBX_REAP, …) from its
		// environment, which is the box's, and hides SBX_* variables from commands.
		if strings.HasPrefix(k, "SBX_") {
			return fmt.Errorf("gvisor: environment variable %q: the SBX_ prefix is reserved for the guest init", k)
		}
	}
	return nil
}

// networkFlag maps a spec's network mode to runsc's --network value: "none", or for egress
// "sandbox" in the namespace the driver prepared; never "host", which would share the host's.
func networkFlag(spec runtime.BoxSpec) (string, error) {
	switch spec.Network {
	case "", netpolicy.ModeNone:
		return "none", nil
	case netpolicy.ModeEgress:
		// runsc's own network stack, in the namespace the driver made (network.go).
		return "sandbox", nil
	default:
		return "", fmt.Errorf("gvisor: network mode %q is not supported by the local driver (none or egress)", spec.Network)
	}
}
