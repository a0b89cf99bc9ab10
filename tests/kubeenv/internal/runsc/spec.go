package runsc

// The subset of the OCI runtime spec (v1.0.2) the node writes, as in the project's local
// driver (runtime/gvisor/bundle.go): a dozen structs rather than the runtime-spec module.

// Spec is an OCI bundle's config.json.
type Spec struct {
	Version  string  `json:"ociVersion"`
	Root     Root    `json:"root"`
	Process  Process `json:"process"`
	Hostname string  `json:"hostname,omitempty"`
	Mounts   []Mount `json:"mounts"`
	Linux    Linux   `json:"linux"`
}

// Root is the container's root filesystem.
type Root struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

// Process is the container's first process.
type Process struct {
	Terminal        bool         `json:"terminal"`
	User            User         `json:"user"`
	Args            []string     `json:"args"`
	Env             []string     `json:"env"`
	Cwd             string       `json:"cwd"`
	Capabilities    Capabilities `json:"capabilities"`
	Rlimits         []Rlimit     `json:"rlimits"`
	NoNewPrivileges bool         `json:"noNewPrivileges"`
}

// User is the uid and gids the process runs as.
type User struct {
	UID            uint32   `json:"uid"`
	GID            uint32   `json:"gid"`
	AdditionalGids []uint32 `json:"additionalGids,omitempty"`
}

// Capabilities are the process's capability sets.
type Capabilities struct {
	Bounding    []string `json:"bounding"`
	Effective   []string `json:"effective"`
	Permitted   []string `json:"permitted"`
	Inheritable []string `json:"inheritable,omitempty"`
}

// Rlimit is one resource limit of the process.
type Rlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

// Mount is one mount of the container.
type Mount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

// Linux holds the namespaces, resources and cgroup of the container. The masked and
// read-only paths are only set for runc (package runc): gVisor's /proc and /sys expose
// nothing of the host to mask.
type Linux struct {
	Namespaces    []Namespace `json:"namespaces"`
	Resources     *Resources  `json:"resources,omitempty"`
	CgroupsPath   string      `json:"cgroupsPath,omitempty"`
	MaskedPaths   []string    `json:"maskedPaths,omitempty"`
	ReadonlyPaths []string    `json:"readonlyPaths,omitempty"`
}

// Namespace is one namespace the container gets.
type Namespace struct {
	Type string `json:"type"`
}

// Resources are the container's cgroup limits.
type Resources struct {
	// Devices is the device cgroup's rules (set for runc only: see package runc).
	Devices []DeviceRule `json:"devices,omitempty"`
	Memory  *Memory      `json:"memory,omitempty"`
	CPU     *CPU         `json:"cpu,omitempty"`
	Pids    *Pids        `json:"pids,omitempty"`
}

// DeviceRule is one rule of the device cgroup.
type DeviceRule struct {
	Allow  bool   `json:"allow"`
	Access string `json:"access,omitempty"`
}

// Memory is the memory limit in bytes.
type Memory struct {
	Limit int64 `json:"limit"`
}

// CPU is a CFS quota per period, in microseconds.
type CPU struct {
	Quota  int64  `json:"quota"`
	Period uint64 `json:"period"`
}

// Pids is the pids cgroup limit.
type Pids struct {
	Limit int64 `json:"limit"`
}

// DockerCaps is Docker's default capability set (what a Kubernetes container gets by default).
var DockerCaps = []string{
	"CAP_AUDIT_WRITE", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_MKNOD", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_SETFCAP", "CAP_SETGID", "CAP_SETPCAP",
	"CAP_SETUID", "CAP_SYS_CHROOT",
}
