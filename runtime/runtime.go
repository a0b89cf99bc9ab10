// Package runtime defines the Driver seam between the domain service and the boxes that run
// sandboxes: a box is one gVisor container (local) or one pod + PVC (Kubernetes) with a
// workspace that outlives the box's compute. The driver's records are the runtime truth.
//
// This package imports no other package of the project.
package runtime

import (
	"context"
	"errors"
	"io"
	"time"
)

// Errors a driver returns; callers test them with errors.Is.
var (
	ErrNotFound = errors.New("runtime: box not found")
	ErrExists   = errors.New("runtime: box already exists")
	// ErrNotRunning means the box has no running compute to act on (attach, stop).
	ErrNotRunning = errors.New("runtime: box is not running")
	// ErrFenced means a write carried a fence (WithFence) lower than one the box has seen
	// already: a newer holder of the sandbox's operation lock has acted on it since the
	// caller's lock lapsed. The driver changed nothing.
	ErrFenced = errors.New("runtime: fenced off: a newer holder of the sandbox's operation lock has written to the box")
	// ErrUnsupported means the driver cannot do what was asked at all (the Kubernetes driver
	// cannot keep a box's memory: Pause).
	ErrUnsupported = errors.New("runtime: not supported by this runtime")
)

// ImageError means a memory image (Pause, Resume) cannot bring a box's processes back here:
// it is malformed or does not match its manifest, it was made by another runsc build or on
// another host, or the box's workspace is not the one it was made with. The box is left as it
// was (no compute); its workspace is intact. Reason is meant for the sandbox's owner.
type ImageError struct {
	Reason string
	// Corrupt marks an image whose bytes do not match what was stored (a hash mismatch, a
	// malformed archive).
	Corrupt bool
	Err     error
}

func (e *ImageError) Error() string { return "runtime: memory image not restored: " + e.Reason }

func (e *ImageError) Unwrap() error { return e.Err }

// StartError means a box's compute cannot run as specified: its pod cannot be scheduled, its
// image cannot run, its container ended at once. Reason is meant for the sandbox's owner.
type StartError struct{ Reason string }

func (e *StartError) Error() string { return "runtime: the sandbox cannot run: " + e.Reason }

// Phase is what the driver observes of a box's compute, independent of the domain's lifecycle state.
type Phase string

const (
	// PhaseRunning: the box's compute is up and its guest init answers attaches.
	PhaseRunning Phase = "running"
	// PhaseStopped: no compute; the workspace is kept.
	PhaseStopped Phase = "stopped"
	// PhaseFailed: the compute died under us (out of memory, crashed, pod deleted); Reason says why.
	PhaseFailed Phase = "failed"
)

// BoxSpec is what a box is built from. It is resolved from a profile at create and stored in the
// record, so a later start builds the same box.
type BoxSpec struct {
	// Profile names the profile the spec came from.
	Profile string `json:"profile"`
	// Rootfs is the read-only base root filesystem (a host folder, local driver).
	Rootfs string `json:"rootfs,omitempty"`
	// Image is the container image (Kubernetes driver).
	Image string `json:"image,omitempty"`
	// ImageHasInit says that Image carries the guest init at /.sbx/init (the images the project
	// builds do): the Kubernetes driver then runs it without an init container.
	ImageHasInit bool `json:"image_has_init,omitempty"`
	// MilliCPU is the CPU limit in thousandths of a core; 0 means no limit.
	MilliCPU int64 `json:"milli_cpu,omitempty"`
	// MemoryBytes is the memory limit; 0 means no limit.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// DiskBytes is the workspace size: the PVC's request on Kubernetes, the size of the box's
	// own ext4 file system on the local driver (0: the driver's default).
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// PidsLimit is a generous backstop on host tasks; 0 means the driver default.
	PidsLimit int64 `json:"pids_limit,omitempty"`
	// Network is "none" (only the sandbox's own loopback) unless a profile allows more:
	// "egress", whose rules are NetworkPolicy.
	Network string `json:"network,omitempty"`
	// NetworkPolicy is the box's effective network policy when Network is "egress" (nil for
	// "none"): the domain resolves it at create (internal/netpolicy); a driver renders it.
	NetworkPolicy *NetworkPolicy `json:"network_policy,omitempty"`
	// Env is added to the environment of every process in the box.
	Env map[string]string `json:"env,omitempty"`
}

// NetworkPolicy is a box's effective egress policy. A new outbound connection's destination is
// decided by the most specific entry of Allow, Deny and AlwaysDeny that holds it (the longest
// prefix; at one prefix Deny beats Allow, which beats AlwaysDeny); no entry: denied. internal/netpolicy owns the rules over it
// (Rules); drivers render those rules and nothing else.
type NetworkPolicy struct {
	// Mode is "none" or "egress".
	Mode string `json:"mode"`
	// Allow are IPv4 CIDRs and host names; a host name allows the addresses in Pinned.
	Allow []string `json:"allow,omitempty"`
	// Deny are IPv4 CIDRs.
	Deny []string `json:"deny,omitempty"`
	// AlwaysDeny are the ranges denied unless an entry of Allow inside them opens them
	// (link-local and metadata, loopback, private and the cluster's ranges).
	AlwaysDeny []string `json:"always_deny,omitempty"`
	// DNS are the only resolvers the box may query (UDP and TCP port 53), whatever the rules
	// say; port 53 of any other address is denied.
	DNS []string `json:"dns,omitempty"`
	// Pinned are the IPv4 addresses each host name of Allow resolved to at create.
	Pinned map[string][]string `json:"pinned,omitempty"`
}

// Record is the sandbox's own record, kept by the driver beside the box (a JSON file locally,
// annotations on Kubernetes). The driver stores it and does not interpret the domain fields.
type Record struct {
	ID      string  `json:"id"`
	Tenant  string  `json:"tenant"`
	Project string  `json:"project"`
	Spec    BoxSpec `json:"spec"`

	// State is the domain lifecycle state last written by the control plane (CREATING, RUNNING, …).
	State string `json:"state"`
	// StateReason explains State (why a sandbox FAILED, say).
	StateReason string `json:"state_reason,omitempty"`
	// DesiredState is where the control plane is taking the sandbox (RUNNING, STOPPED, DESTROYED).
	DesiredState string `json:"desired_state"`
	// LatestCheckpoint is the id of the newest complete workspace checkpoint ("" when none).
	LatestCheckpoint string `json:"latest_checkpoint,omitempty"`

	AutostopSec int64 `json:"autostop_sec,omitempty"`
	TTLSec      int64 `json:"ttl_sec,omitempty"`

	CreatedAt      time.Time `json:"created_at"`
	StateChangedAt time.Time `json:"state_changed_at"`
	// Annotations hold further domain fields; keys and values are short strings.
	Annotations map[string]string `json:"annotations,omitempty"`
	// Labels are the caller's labels of the sandbox, in Kubernetes' label syntax (checked by
	// the domain; none under the service's reserved prefixes). A driver keeps them with the
	// record and may also put them on the box's objects (the Kubernetes driver labels the
	// PVC and the pod with them).
	Labels map[string]string `json:"labels,omitempty"`
	// Pool names the warm pool (by its profile) that holds the box: such a box is no sandbox
	// yet (no tenant, nothing run in it). Drivers leave it out of Get and List; a Pooler lists
	// and claims it. Create of a record with Pool set makes a box of the pool.
	Pool string `json:"pool,omitempty"`
}

// Box is a record together with what the driver observes of its compute.
type Box struct {
	Record Record
	Phase  Phase
	// Reason says why a box is PhaseFailed.
	Reason string
	// Lost marks a PhaseFailed box whose compute was taken away from under it (its pod deleted
	// or evicted, its node gone) rather than ending by itself: the workspace is intact and the
	// domain starts the box again.
	Lost bool
	// Fence is the highest fence a write to the box has carried (0: none did); see WithFence.
	Fence uint64
}

// Driver owns boxes. Every method is safe for concurrent use; methods on one box are serialized by
// the caller. Implementations: runtime/gvisor (local runsc) and runtime/kube (pods + PVCs).
//
// The writes (Create, Start, Stop, Delete, UpdateRecord, Pause, DropMemoryImage, Resume) honour a fence in ctx (WithFence):
// before it changes anything, a write whose fence is lower than the box's Fence fails with
// ErrFenced; a higher one becomes the box's Fence, kept with the box's record. A write without
// a fence is not checked. Get, List, Attach, Check and MemoryImage are reads and ignore it.
type Driver interface {
	// Name is a short name for logs and metrics ("gvisor", "kube").
	Name() string
	// Create stores the record, creates an empty workspace and starts the box's compute.
	// It returns ErrExists when a box with that id exists already.
	Create(ctx context.Context, rec Record) error
	// Start starts the compute of a stopped or failed box on its kept workspace. fresh reports
	// that the workspace was gone and an empty one was made (the caller restores a checkpoint).
	Start(ctx context.Context, id string) (fresh bool, err error)
	// Stop ends the box's compute and keeps its workspace and record. Stopping a stopped box is
	// not an error.
	Stop(ctx context.Context, id string) error
	// Delete removes the compute, the workspace and the record. Deleting a missing box is not an
	// error.
	Delete(ctx context.Context, id string) error
	// Get returns one box, or ErrNotFound.
	Get(ctx context.Context, id string) (Box, error)
	// List returns every box the driver owns: the truth the Redis lookup is rebuilt from.
	List(ctx context.Context) ([]Box, error)
	// UpdateRecord applies fn to the stored record and stores the result atomically. A write
	// refused for its fence does not call fn.
	UpdateRecord(ctx context.Context, id string, fn func(*Record) error) (Record, error)
	// Attach opens a byte stream to the guest init inside a running box (its `connect`
	// command). Closing the stream ends the attach. ErrNotRunning when the box has no compute.
	Attach(ctx context.Context, id string) (io.ReadWriteCloser, error)
	// Check reports whether the driver can create boxes (for /readyz).
	Check(ctx context.Context) error

	// Pause saves a running box's memory and processes as an image the driver keeps beside the
	// box and ends its compute, as a crash would: the box is no longer PhaseRunning, its
	// workspace is still readable (ExportWorkspace), and Stop releases the rest. A box whose
	// compute is gone and that has a kept image was paused already: no error. A driver that
	// cannot keep a box's memory returns an error wrapping ErrUnsupported; a box whose state
	// cannot be saved (a guest that refuses, with its reason) keeps running. ctx may carry the
	// caller's way to quiesce the guest init over an attach it holds (WithQuiesce).
	Pause(ctx context.Context, id string) error
	// MemoryImage opens the image the last Pause kept, as an uncompressed tar stream, for the
	// caller to store elsewhere; ErrNotFound when none is kept. The driver keeps its copy (a
	// Resume on the same host restores from it when it is intact) until Resume, Start,
	// DropMemoryImage or Delete.
	MemoryImage(ctx context.Context, id string) (io.ReadCloser, error)
	// DropMemoryImage deletes the kept image. Dropping none is not an error.
	DropMemoryImage(ctx context.Context, id string) error
	// Resume starts a box's compute from its memory image on the box's kept workspace: its
	// processes go on from where Pause saved them. A driver that kept the image (and finds it
	// intact) restores from its own copy; else it opens the stored copy with stored (a tar
	// stream as MemoryImage gave it), reads it to its end before anything runs (so a reader
	// that fails at its end, a checkpoint whose hash does not match, stops it) and restores
	// from that. stored's errors are returned as they are. An image that cannot be restored
	// here is an *ImageError, and the box is left without compute; a running box is left alone
	// (the call only makes sure its guest init answers).
	Resume(ctx context.Context, id string, stored ImageSource) error
}

// Pooler is implemented by drivers that keep warm boxes (records with Pool set): booted ahead
// of any create, out of Get and List, until a create claims one.
type Pooler interface {
	// ListPool returns the boxes of every warm pool.
	ListPool(ctx context.Context) ([]Box, error)
	// UpdatePool applies fn to a box of a pool and stores the result atomically, as
	// UpdateRecord does (fence included), across every process sharing the driver's state
	// (durably or not: a pool box does not outlive a host crash, and the sandbox's next
	// UpdateRecord makes a claim durable). What a claim leaves to finish beside the caller's
	// next steps (the kube runtime's relabel of the box's pod) has finished when that
	// UpdateRecord returns.
	// ErrNotFound when id is not, or no longer, a box of a pool. An fn that clears Pool claims
	// the box: from then on it is an ordinary box (Get, List, UpdateRecord), and every later
	// UpdatePool of it is ErrNotFound, so no box is claimed twice.
	UpdatePool(ctx context.Context, id string, fn func(*Record) error) (Record, error)
}

// SharedPooler is a Pooler whose pools every replica shares (a cluster's, not one host's): the
// domain keeps each profile's warm_pool once for all replicas, filled by one of them at a time.
type SharedPooler interface {
	Pooler
	// PoolsShared marks the driver; it does nothing.
	PoolsShared()
}

// ImageSource opens the stored copy of a box's memory image, when a driver's Resume needs it.
type ImageSource func(ctx context.Context) (io.ReadCloser, error)

// Capability returns the driver under d's wrappers (those with an Unwrap method, as the
// domain's cache and the tracing wrapper have) that implements T, as errors.As finds an error.
// It is for optional interfaces a wrapper does not carry itself (StoppedWorkspaceReader):
// their calls bypass the wrappers.
func Capability[T any](d Driver) (T, bool) {
	for d != nil {
		if t, ok := d.(T); ok {
			return t, true
		}
		u, ok := d.(interface{ Unwrap() Driver })
		if !ok {
			break
		}
		d = u.Unwrap()
	}
	var zero T
	return zero, false
}

// LocalAttacher is implemented by drivers that can attach with a connect on this host (a unix
// socket into the box: no process, no API server). The domain then starts commands over exec
// streams (guest/proto/stream.go), each an AttachStream of its own kept across commands, beside
// the Attach every other call shares.
type LocalAttacher interface {
	// AttachStream is Attach by that connect only: when the box cannot be reached so, it fails
	// (the caller goes on with its Attach) rather than start a process.
	AttachStream(ctx context.Context, id string) (io.ReadWriteCloser, error)
}

// StoppedWorkspaceReader is implemented by drivers whose stopped box keeps its workspace on a
// volume they can read beside the box, at the speed of the node's own file system (the kube
// driver: a short-lived pod on the cluster's native runtime mounts the box's PVC read-only).
// The domain then stops the box first and checkpoints its workspace after: the workspace does
// not change once the box is stopped, and no byte goes through the box's own kernel.
type StoppedWorkspaceReader interface {
	// ReadsStoppedWorkspaces reports whether the driver is set up to (the kube driver: only
	// when its workspace reader is configured).
	ReadsStoppedWorkspaces() bool
	// StopAndExport stops box id as Stop does, then streams its workspace as
	// ExportStoppedWorkspace does (the driver may prepare the read while the box stops). The
	// error is the stop's; once the box is stopped, a read that cannot be made is the
	// stream's first read error.
	StopAndExport(ctx context.Context, id string) (io.ReadCloser, error)
	// ExportStoppedWorkspace streams the workspace of stopped box id as a zstd-compressed tar
	// (a window of at most 8 MiB: the reader compresses it on the node's cores, and the
	// checkpoint store keeps it as it comes) that never follows a symlink (otherwise
	// WorkspaceExporter's tar). A read error, not io.EOF,
	// ends a stream whose reader failed, also when what came before is a whole tar. Closing
	// it releases what the read held (the reader pod).
	ExportStoppedWorkspace(ctx context.Context, id string) (io.ReadCloser, error)
}

// WorkspaceExporter is implemented by drivers that can read a box's workspace without its
// guest init (the local driver reads the host folder, ten times faster than through gVisor's
// file system, and also when the box has died). The stream is an uncompressed tar that never
// follows a symlink; the domain prefers it for checkpoints and falls back to the guest's export.
//
// Such a driver also tells, without reading it, whether a box's workspace has changed since an
// earlier moment (the local driver: its disk's mount and the count of what was written to it),
// or that it cannot tell. The domain uses it to let a pause whose workspace is unchanged since
// the latest checkpoint keep that checkpoint instead of writing the same bytes again.
type WorkspaceExporter interface {
	ExportWorkspace(ctx context.Context, id string) (io.ReadCloser, error)
	// WorkspaceVersion returns the workspace's version now, "" when the driver cannot tell
	// (the version then never matches). Call it only while nothing in the box runs (after its
	// Pause): a checkpoint of the workspace taken before the box runs again holds the
	// workspace at that version. unchanged is true only when since is a version an earlier
	// call returned and nothing has changed in the workspace since that call; a write the
	// host has not put on the disk yet counts as a change. With settle, the host first puts
	// every such write on the disk: the version is then that of what the workspace holds now.
	// Without it the version can be an earlier one (a later call then finds the workspace
	// changed, which only costs a checkpoint), and nothing is written back unless the version
	// matches since.
	WorkspaceVersion(ctx context.Context, id, since string, settle bool) (version string, unchanged bool, err error)
}

// Seed opens the workspace tar a seeded create or start extracts (a checkpoint, hashed as it is
// read: an error from its reader fails the extraction before anything is installed).
type Seed func(ctx context.Context) (io.ReadCloser, error)

// WorkspaceSeeder is implemented by drivers that can fill a box's workspace from a tar before
// its compute starts, on the host at disk speed, instead of through the running guest (the
// local driver). The extraction follows the guest import's rules (guest/server.ImportTar).
type WorkspaceSeeder interface {
	// CreateSeeded is Create with the workspace extracted from seed before the box starts.
	CreateSeeded(ctx context.Context, rec Record, seed Seed) error
	// StartSeeded is Start; when the box's workspace is fresh (the runtime lost it), it is
	// extracted from seed before the box starts, and fresh is false: nothing is left to restore.
	StartSeeded(ctx context.Context, id string, seed Seed) (fresh bool, err error)
}

// SeedError is a seeded create's or start's failure to extract its seed: Err is the seed's
// own error (a corrupt checkpoint) or the extraction's (*proto.Error of guest/proto).
type SeedError struct{ Err error }

func (e *SeedError) Error() string { return "extracting the workspace: " + e.Err.Error() }
func (e *SeedError) Unwrap() error { return e.Err }
