// Package gvisor is the local runtime driver: one runsc (gVisor) container per box, built from
// an OCI bundle over a profile's read-only base rootfs, with the box's workspace a folder on its
// own ext4 disk (a loop-mounted image of the spec's DiskBytes, see disk.go) mounted at
// /workspace and the guest init (cmd/sandbox-init) as PID 1. Everything the driver keeps lives
// under its StateDir:
//
//	StateDir/boxes/<id>/record.json      the sandbox record (the runtime truth) and the box's
//	                                     fence (runtime.WithFence), written atomically
//	StateDir/boxes/<id>/disk.img         the box's disk (the local stand-in for a PVC)
//	StateDir/boxes/<id>/disk/workspace/  the workspace, on that disk mounted at disk/
//	StateDir/boxes/<id>/bundle/config.json
//	StateDir/boxes/<id>/runsc.log        stdio of runsc create/start, the sandbox and attaches
//	StateDir/init/init                   the guest init, mounted read-only at /.sbx
//	StateDir/runsc-root/                 runsc's --root
//
// A box's phase is observed without running runsc: the container's state file in the runsc
// root gives the sandbox process's pid, and /proc says whether that process is alive (a
// zombie is not: `runsc state` keeps saying "running" for a sandbox the OOM killer took). A
// dead sandbox is PhaseFailed; the reason names an OOM kill when the box's memory cgroup
// counted one.
package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"sandboxd/guest/proto"
	"sandboxd/internal/netpolicy"
	"sandboxd/runtime"
)

// Options configure a Driver.
type Options struct {
	// Runsc is the runsc binary (a path, or a name looked up in PATH).
	Runsc string
	// StateDir holds everything of the driver (e.g. /var/lib/sandboxd/gvisor).
	StateDir string
	// InitBinary is the host path of the static guest init binary.
	InitBinary string
	// SpawnerBinary is the host path of the static spawner program (guest/spawner,
	// scripts/build-guest-c.sh) that the init starts the commands with; default
	// "sandbox-spawn" beside InitBinary when that is an executable file. Without one the
	// init forks every command itself, which costs a command's start a few milliseconds
	// more (one trap per signal handler Go installed).
	SpawnerBinary string
	// Platform is runsc's --platform; default "systrap".
	Platform string
	// ExtraFlags are appended to runsc's global flags on every call.
	ExtraFlags []string
	// ReadyTimeout bounds how long Create and Start wait for the guest init to answer;
	// default 10 s.
	ReadyTimeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// DefaultDiskBytes is the disk of a box whose spec sets no DiskBytes; default
	// DefaultDiskBytes (see disk.go).
	DefaultDiskBytes int64
	// Mkfs is the mkfs.ext4 binary; default: looked up in PATH and the sbin folders.
	Mkfs string
	// LocalSubnet is the IPv4 range boxes with egress get a /30 each from (default
	// DefaultLocalSubnet).
	LocalSubnet string
	// KeptMounts is how many stopped boxes keep their disk mounted, and its page cache, for
	// their next start and stop (default DefaultKeptMounts; negative: none, every stop
	// unmounts). See keptMounts.
	KeptMounts int
}

// Driver is the local gVisor runtime driver. It implements runtime.Driver.
type Driver struct {
	opts    Options
	log     *slog.Logger
	rootDir string
	initDir string

	// boxes is the boxes' folders and their records; disks their workspace disks.
	boxes *boxStore
	disks *disks
	// net makes and removes the networks of boxes with egress.
	net *netState

	// spares holds, per box, the ready attach of its last create or start.
	spares runtime.Spares
	// pool is the index of the boxes of warm pools (pool.go).
	pool poolIndex
	// kept is the stopped boxes whose disks stay mounted (keptmounts.go).
	kept keptMounts
	// teardowns is the paused boxes' containers being deleted in the background, each held
	// by its gate until the pause is recorded or teardownHold has passed (teardown.go).
	teardowns     runtime.Jobs
	teardownGates gates
	teardownHold  time.Duration

	// boxMu serializes lifecycle operations on one box within this process (boxes serializes
	// record read-modify-writes).
	boxMu keyedMutex
	// createMu is held shared by runsc create (exclusively while runsc's shared null-netns
	// is not pinned: see lockForCreate) and exclusively while that mount is removed.
	createMu sync.RWMutex
	initMu   sync.Mutex

	// identCache is what memory images made here record of their maker (pause.go).
	identCache

	// runscOK is the runsc binary Check last ran `runsc --version` of successfully.
	runscOK struct {
		sync.Mutex
		seen runscSeen
	}
}

var _ runtime.Driver = (*Driver)(nil)

// New returns a driver over opts.StateDir, creating its folders.
func New(opts Options) (*Driver, error) {
	if opts.Runsc == "" {
		return nil, errors.New("gvisor: Options.Runsc is required")
	}
	if !filepath.IsAbs(opts.Runsc) {
		p, err := exec.LookPath(opts.Runsc)
		if err != nil {
			return nil, fmt.Errorf("gvisor: runsc: %w", err)
		}
		opts.Runsc = p
	}
	if opts.StateDir == "" || opts.InitBinary == "" {
		return nil, errors.New("gvisor: Options.StateDir and Options.InitBinary are required")
	}
	var err error
	if opts.StateDir, err = filepath.Abs(opts.StateDir); err != nil {
		return nil, err
	}
	if opts.InitBinary, err = filepath.Abs(opts.InitBinary); err != nil {
		return nil, err
	}
	if opts.SpawnerBinary == "" {
		if beside := filepath.Join(filepath.Dir(opts.InitBinary), "sandbox-spawn"); isExecutableFile(beside) {
			opts.SpawnerBinary = beside
		}
	} else {
		if opts.SpawnerBinary, err = filepath.Abs(opts.SpawnerBinary); err != nil {
			return nil, err
		}
		if !isExecutableFile(opts.SpawnerBinary) {
			return nil, fmt.Errorf("gvisor: the spawner program %s is not an executable file", opts.SpawnerBinary)
		}
	}
	if opts.Platform == "" {
		opts.Platform = "systrap"
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 10 * time.Second
	}
	opts.ExtraFlags = slices.Clone(opts.ExtraFlags)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.DefaultDiskBytes <= 0 {
		opts.DefaultDiskBytes = DefaultDiskBytes
	}
	if opts.DefaultDiskBytes < MinDiskBytes {
		return nil, fmt.Errorf("gvisor: Options.DefaultDiskBytes %d is below %d MiB", opts.DefaultDiskBytes, MinDiskBytes>>20)
	}
	switch {
	case opts.KeptMounts == 0:
		opts.KeptMounts = DefaultKeptMounts
	case opts.KeptMounts < 0:
		opts.KeptMounts = 0
	}
	if opts.Mkfs == "" {
		// A missing mkfs.ext4 is reported by Check (readiness) and by every create.
		opts.Mkfs, _ = findMkfs()
	}
	d := &Driver{
		spares: runtime.Spares{Ended: func(rwc io.ReadWriteCloser) bool {
			as, ok := rwc.(*attachStream)
			if !ok {
				return false
			}
			select {
			case <-as.done:
				return true
			default:
				return false
			}
		}},
		opts:    opts,
		log:     opts.Logger.With("driver", "gvisor"),
		boxes:   &boxStore{dir: filepath.Join(opts.StateDir, "boxes")},
		rootDir: filepath.Join(opts.StateDir, "runsc-root"),
		initDir: filepath.Join(opts.StateDir, "init"),
		pool:    poolIndex{dir: filepath.Join(opts.StateDir, poolDn)},
		kept:    keptMounts{max: opts.KeptMounts},

		teardownHold: teardownHold,
	}
	if opts.SpawnerBinary == "" {
		d.log.Info("no spawner program beside the guest init: PID 1 forks every command itself, a few ms slower per exec",
			"init", opts.InitBinary)
	}
	for _, dir := range []string{d.boxes.dir, d.rootDir, d.initDir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
	}
	if err := d.rebuildPoolIndex(); err != nil {
		return nil, err
	}
	// The init folder is mounted into every box: it must be traversable there.
	if err := os.Chmod(d.initDir, 0o755); err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	pool, err := newDiskPool(opts.StateDir)
	if err != nil {
		return nil, fmt.Errorf("gvisor: disk pool: %w", err)
	}
	d.disks = &disks{boxes: d.boxes, mkfs: opts.Mkfs, defaultBytes: opts.DefaultDiskBytes, log: d.log, pool: pool}
	if d.net, err = newNetState(opts.StateDir, opts.LocalSubnet, d.log); err != nil {
		return nil, err
	}
	// What a killed server left of boxes' networks: a box whose container is gone has none.
	d.net.reconcile(context.Background(), func(ctx context.Context, id string) bool {
		phase, _, err := d.observe(ctx, id)
		return err == nil && phase == runtime.PhaseRunning
	})
	// An earlier server on this folder may have stopped (or died) with runsc's shared mount
	// still there and no container left.
	d.cleanSharedMounts()
	d.adoptKeptMounts()
	return d, nil
}

// Close stops the disk pool's refills and releases what the driver holds on the host that no
// box needs: runsc's shared null-netns mount when no container is left. Boxes keep running
// (and their disks mounted): they outlive the server.
func (d *Driver) Close() error {
	d.disks.pool.close()
	d.teardownGates.releaseAll()
	d.teardowns.WaitAll()
	d.kept.wg.Wait()
	d.net.removeTableIfIdle()
	d.cleanSharedMounts()
	return nil
}

// Name implements runtime.Driver.
func (d *Driver) Name() string { return "gvisor" }

// RootDir is runsc's --root folder of this driver (for tools and tests: `runsc --root … list`).
func (d *Driver) RootDir() string { return d.rootDir }

// Create implements runtime.Driver: it writes the record, makes the workspace and the bundle,
// creates and starts the container and returns once the guest init answers. On failure it
// leaves nothing behind.
func (d *Driver) Create(ctx context.Context, rec runtime.Record) (err error) {
	return d.CreateSeeded(ctx, rec, nil)
}

// CreateSeeded implements runtime.WorkspaceSeeder: Create, with the workspace extracted from
// seed (when not nil) on the host before the box starts.
func (d *Driver) CreateSeeded(ctx context.Context, rec runtime.Record, seed runtime.Seed) (err error) {
	id := rec.ID
	if !ValidID(id) {
		return fmt.Errorf("gvisor: invalid box id %q", id)
	}
	if err := validateSpec(rec.Spec); err != nil {
		return err
	}
	if err := validateDisk(rec.Spec); err != nil {
		return err
	}
	if fi, err := os.Stat(rec.Spec.Rootfs); err != nil || !fi.IsDir() {
		return fmt.Errorf("gvisor: rootfs %q is not a folder", rec.Spec.Rootfs)
	}
	unlock := d.boxMu.lock(id)
	defer unlock()
	start := time.Now()
	if err := d.checkPrefixes(id); err != nil {
		return err
	}
	if err := os.Mkdir(d.boxes.boxDir(id), 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("gvisor: box %s: %w", id, runtime.ErrExists)
		}
		return fmt.Errorf("gvisor: create box folder: %w", err)
	}
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cliTimeout)
			defer cancel()
			if cerr := d.destroyContainer(cctx, id); cerr != nil {
				d.log.Error("cleanup after failed create", "box", id, "err", cerr)
				return // keep the folder: it is what names the container left behind
			}
			if uerr := d.disks.unmountDisk(id); uerr != nil {
				d.log.Error("cleanup after failed create", "box", id, "err", uerr)
				return // never remove a folder through a mount
			}
			if rerr := os.RemoveAll(d.boxes.boxDir(id)); rerr != nil {
				d.log.Error("cleanup after failed create", "box", id, "err", rerr)
			}
		}
	}()
	if rec.Pool != "" {
		// The index names the box before its record does (pool.go).
		if err := d.pool.add(id); err != nil {
			return err
		}
	}
	fence, _ := runtime.FenceFrom(ctx)
	if err := d.boxes.writeStored(storedRecord{Record: rec, Fence: fence}); err != nil {
		return err
	}
	if _, err := d.disks.ensureDisk(ctx, id, rec.Spec); err != nil {
		return err
	}
	if seed != nil {
		if err := d.seed(ctx, id, rec.Spec, seed); err != nil {
			return err
		}
	}
	if err := d.startContainer(ctx, id, rec.Spec); err != nil {
		return err
	}
	d.disks.refillDiskPool(d.disks.diskBytes(rec.Spec)) // for the next create, now that this one is up
	d.warmIdentity()
	d.log.Info("box created", "box", id, "ms", time.Since(start).Milliseconds())
	return nil
}

// checkPrefixes refuses an id that is a proper prefix of another box's id or has one as its
// prefix: runsc matches container ids by prefix, so `runsc kill abc` would reach box abcd
// (or fail as ambiguous). The project's fixed-length ids never trip this.
func (d *Driver) checkPrefixes(id string) error {
	entries, err := os.ReadDir(d.boxes.dir)
	if err != nil {
		return fmt.Errorf("gvisor: list boxes: %w", err)
	}
	for _, e := range entries {
		other := e.Name()
		if other != id && (strings.HasPrefix(other, id) || strings.HasPrefix(id, other)) {
			return fmt.Errorf("gvisor: box id %q and existing %q are prefixes of one another (runsc matches ids by prefix)", id, other)
		}
	}
	return nil
}

// Start implements runtime.Driver. A running box is left alone (fresh = false).
func (d *Driver) Start(ctx context.Context, id string) (fresh bool, err error) {
	return d.StartSeeded(ctx, id, nil)
}

// StartSeeded implements runtime.WorkspaceSeeder: Start, and when the workspace is fresh and
// seed is not nil, the workspace extracted from seed on the host before the box starts (fresh
// is then false).
func (d *Driver) StartSeeded(ctx context.Context, id string, seed runtime.Seed) (fresh bool, err error) {
	if err := checkID(id); err != nil {
		return false, err
	}
	unlock := d.boxMu.lock(id)
	defer unlock()
	if err := d.boxes.admitFence(ctx, id); err != nil {
		return false, err
	}
	rec, err := d.boxes.readRecord(id)
	if err != nil {
		return false, err
	}
	phase, _, err := d.observe(ctx, id)
	if err != nil {
		return false, err
	}
	if phase == runtime.PhaseRunning {
		d.clearPausing(id)
		return false, nil
	}
	start := time.Now()
	d.clearPausing(id)
	if err := d.destroyContainer(ctx, id); err != nil {
		return false, err
	}
	// The disk is mounted again unless a stop kept it mounted (a stop beyond the kept ones
	// unmounted it, a host reboot did); a box without one, or without a workspace on it,
	// starts fresh.
	if err := d.takeKept(id); err != nil {
		return false, err
	}
	fresh, err = d.disks.ensureDisk(ctx, id, rec.Spec)
	if err != nil {
		return false, err
	}
	seeded := false
	if fresh && seed != nil {
		if err := d.seed(ctx, id, rec.Spec, seed); err != nil {
			if uerr := d.disks.unmountDisk(id); uerr != nil {
				d.log.Error("cleanup after a failed seed", "box", id, "err", uerr)
			}
			return fresh, err
		}
		seeded = true
	}
	if err := d.startContainer(ctx, id, rec.Spec); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cliTimeout)
		defer cancel()
		if cerr := d.destroyContainer(cctx, id); cerr != nil {
			d.log.Error("cleanup after failed start", "box", id, "err", cerr)
		} else if uerr := d.disks.unmountDisk(id); uerr != nil {
			d.log.Error("cleanup after failed start", "box", id, "err", uerr)
		}
		return fresh, err
	}
	if fresh {
		d.disks.refillDiskPool(d.disks.diskBytes(rec.Spec)) // it may have taken the pool's image
	}
	// A memory image kept from a pause is stale once the box runs anew.
	if err := d.dropImages(id); err != nil {
		d.log.Warn("removing a started box's memory image", "box", id, "err", err)
	}
	d.warmIdentity()
	d.log.Info("box started", "box", id, "fresh", fresh, "seeded", seeded, "ms", time.Since(start).Milliseconds())
	return fresh && !seeded, nil
}

// Stop implements runtime.Driver: kill and delete the container, keep the disk image (the
// workspace) and the record. The disk stays mounted, with its page cache, until more than
// Options.KeptMounts stopped boxes hold theirs (keptmounts.go).
func (d *Driver) Stop(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	unlock := d.boxMu.lock(id)
	defer unlock()
	if _, err := os.Stat(d.boxes.boxDir(id)); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("gvisor: box %s: %w", id, runtime.ErrNotFound)
	}
	if err := d.boxes.admitFence(ctx, id); err != nil {
		return err
	}
	// A paused box's processes ended with its checkpoint; the deletion of what runsc keeps of
	// its container may go on in the background (teardown.go) while its disk stays mounted.
	if d.kept.max == 0 || !d.teardowns.Pending(id) {
		if err := d.destroyContainer(ctx, id); err != nil {
			return err
		}
	}
	d.clearPausing(id)
	if d.kept.max == 0 {
		if err := d.disks.unmountDisk(id); err != nil {
			return err
		}
	} else {
		d.keepMounted(id)
	}
	d.log.Info("box stopped", "box", id)
	return nil
}

// Delete implements runtime.Driver: the container, the disk (unmounted first: a folder is
// never removed through a mount) and the box folder. A box without a record (what a failed
// create left) has no fence to check.
func (d *Driver) Delete(ctx context.Context, id string) error {
	if !ValidID(id) {
		return fmt.Errorf("gvisor: invalid box id %q", id)
	}
	unlock := d.boxMu.lock(id)
	defer unlock()
	if err := d.boxes.admitFence(ctx, id); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		return err
	}
	if err := d.destroyContainer(ctx, id); err != nil {
		return err
	}
	d.kept.forget(id)
	if err := d.disks.unmountDisk(id); err != nil {
		return err
	}
	if err := os.RemoveAll(d.boxes.boxDir(id)); err != nil {
		return fmt.Errorf("gvisor: remove box %s: %w", id, err)
	}
	d.pool.remove(id)
	d.log.Info("box deleted", "box", id)
	return nil
}

// Get implements runtime.Driver. It is cheap: two small file reads and a /proc check. A box of
// a warm pool is not found (pool.go).
func (d *Driver) Get(ctx context.Context, id string) (runtime.Box, error) {
	if err := checkID(id); err != nil {
		return runtime.Box{}, err
	}
	b, err := d.get(ctx, id)
	if err == nil && b.Record.Pool != "" {
		return runtime.Box{}, errPooled(id) // pool.go
	}
	return b, err
}

// List implements runtime.Driver. Folders without a record (a create in progress) and boxes of
// warm pools are skipped.
func (d *Driver) List(ctx context.Context) ([]runtime.Box, error) {
	entries, err := os.ReadDir(d.boxes.dir)
	if err != nil {
		return nil, fmt.Errorf("gvisor: list boxes: %w", err)
	}
	boxes := make([]runtime.Box, 0, len(entries))
	for _, e := range entries {
		if !e.IsDir() || !ValidID(e.Name()) {
			continue
		}
		b, err := d.Get(ctx, e.Name())
		if errors.Is(err, runtime.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		boxes = append(boxes, b)
	}
	return boxes, nil
}

// UpdateRecord implements runtime.Driver: a read-modify-write under a per-box mutex and a
// flock (for other processes sharing StateDir), stored atomically, the fence compared and set
// in the same step. fn may not change the id.
func (d *Driver) UpdateRecord(ctx context.Context, id string, fn func(*runtime.Record) error) (runtime.Record, error) {
	if err := checkID(id); err != nil {
		return runtime.Record{}, err
	}
	rec, err := d.boxes.updateStored(ctx, id, func(rec *runtime.Record) (bool, error) {
		if rec.Pool != "" {
			return false, errPooled(id) // pool.go
		}
		return true, fn(rec)
	})
	if err == nil {
		// A pause's caller recorded it: the box's container may go now (teardown.go).
		d.teardownGates.release(id)
	}
	return rec, err
}

// Check implements runtime.Driver: runsc runs, StateDir is writable, the guest init exists,
// workspace disks can be made (mkfs.ext4, loop devices).
func (d *Driver) Check(ctx context.Context) error {
	if err := d.checkRunsc(ctx); err != nil {
		return err
	}
	f, err := os.CreateTemp(d.opts.StateDir, ".check*")
	if err != nil {
		return fmt.Errorf("gvisor: state folder not writable: %w", err)
	}
	f.Close()
	os.Remove(f.Name())
	if _, err := os.Stat(d.opts.InitBinary); err != nil {
		return fmt.Errorf("gvisor: guest init: %w", err)
	}
	if !isExecutableFile(d.opts.InitBinary) {
		return fmt.Errorf("gvisor: guest init %s is not an executable file", d.opts.InitBinary)
	}
	// Every create copies it into the box (syncInit): gone, they would all fail.
	if d.opts.SpawnerBinary != "" && !isExecutableFile(d.opts.SpawnerBinary) {
		return fmt.Errorf("gvisor: the spawner program %s is not an executable file", d.opts.SpawnerBinary)
	}
	return d.disks.checkDisks()
}

// isExecutableFile says path is a regular file with an execute bit.
func isExecutableFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// checkRunsc runs `runsc --version` when the binary is new to this driver or changed since
// its last good run (path, inode, size, mtime): a readiness probe every few seconds then costs
// a stat, not the start of a 100 MB binary, which on a loaded machine outlasted the probe's
// bound and turned a healthy replica unready.
func (d *Driver) checkRunsc(ctx context.Context) error {
	st, err := os.Stat(d.opts.Runsc)
	if err != nil {
		return fmt.Errorf("gvisor: runsc: %w", err)
	}
	var ino uint64
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		ino = sys.Ino
	}
	seen := runscSeen{ino: ino, size: st.Size(), mtime: st.ModTime().UnixNano()}
	d.runscOK.Lock()
	defer d.runscOK.Unlock()
	if d.runscOK.seen == seen {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, d.opts.Runsc, "--version").CombinedOutput(); err != nil {
		return fmt.Errorf("gvisor: runsc --version: %w: %s", err, out)
	}
	d.runscOK.seen = seen
	return nil
}

// runscSeen identifies the runsc binary a `runsc --version` last succeeded on.
type runscSeen struct {
	ino         uint64
	size, mtime int64
}

// startContainer writes the bundle, creates and starts the box's container and waits until
// the guest init answers. The caller cleans up on error.
func (d *Driver) startContainer(ctx context.Context, id string, spec runtime.BoxSpec) error {
	if err := d.syncInit(); err != nil {
		return err
	}
	flags, err := d.globalFlags(spec)
	if err != nil {
		return err
	}
	hostDir := d.boxes.boxPath(id, hostDn)
	if err := os.RemoveAll(hostDir); err != nil { // a stale socket of an earlier container
		return fmt.Errorf("gvisor: host socket folder: %w", err)
	}
	if err := os.Mkdir(hostDir, 0o700); err != nil {
		return fmt.Errorf("gvisor: host socket folder: %w", err)
	}
	// A new channel key for this container: the init takes (and deletes) its copy in the host
	// folder; the driver keeps its own beside the record, out of the box's reach.
	// (Renamed into place, not synced: a host crash ends the container the key is for.)
	key := proto.EncodeChannelKey(proto.NewChannelKey())
	tmpKey := d.boxes.boxPath(id, "."+channelKeyName+".tmp")
	if err := os.WriteFile(tmpKey, []byte(key), 0o600); err != nil {
		return fmt.Errorf("gvisor: channel key: %w", err)
	}
	if err := os.Rename(tmpKey, d.boxes.boxPath(id, channelKeyName)); err != nil {
		return fmt.Errorf("gvisor: channel key: %w", err)
	}
	if err := os.WriteFile(filepath.Join(hostDir, channelKeyName), []byte(key), 0o400); err != nil {
		return fmt.Errorf("gvisor: channel key: %w", err)
	}
	if err := os.Remove(d.boxes.boxPath(id, tamperedFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("gvisor: %w", err)
	}
	var nw boxNetwork
	if spec.Network == netpolicy.ModeEgress {
		if nw.netns, err = d.net.up(id, spec.NetworkPolicy); err != nil {
			return err
		}
		nw.resolvConf = d.boxes.boxPath(id, resolvConfFile)
		if err := os.WriteFile(nw.resolvConf, resolvConf(spec.NetworkPolicy), 0o644); err != nil {
			return fmt.Errorf("gvisor: resolv.conf: %w", err)
		}
	}
	oci, err := buildSpec(id, spec, d.disks.workspacePath(id), d.initDir, hostDir, d.opts.SpawnerBinary != "", nw)
	if err != nil {
		return err
	}
	bundle := d.boxes.boxPath(id, bundleDn)
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return fmt.Errorf("gvisor: bundle: %w", err)
	}
	if err := writeJSONAtomic(filepath.Join(bundle, "config.json"), oci); err != nil {
		return err
	}
	if err := writeJSONAtomic(d.boxes.boxPath(id, flagsFile), flags); err != nil {
		return err
	}
	d.rotateLog(id)

	t0 := time.Now()
	unlockCreate := d.lockForCreate()
	err = d.runscLogged(ctx, id, cliTimeout, flags, "create", "--bundle="+bundle, id)
	unlockCreate()
	if err != nil {
		return fmt.Errorf("gvisor: create %s: %w", id, err)
	}
	t1 := time.Now()
	if err := d.runscLogged(ctx, id, cliTimeout, flags, "start", id); err != nil {
		return fmt.Errorf("gvisor: start %s: %w", id, err)
	}
	t2 := time.Now()
	if err := d.waitReady(ctx, id); err != nil {
		return err
	}
	d.log.Debug("container up", "box", id, "create_ms", t1.Sub(t0).Milliseconds(),
		"start_ms", t2.Sub(t1).Milliseconds(), "ready_ms", time.Since(t2).Milliseconds())
	return nil
}

// maxLogBytes is the size past which a box's runsc.log is rotated (to runsc.log.1) when its
// container is next created.
const maxLogBytes = 8 << 20

func (d *Driver) rotateLog(id string) {
	p := d.boxes.boxPath(id, logFile)
	if fi, err := os.Stat(p); err == nil && fi.Size() > maxLogBytes {
		_ = os.Rename(p, p+".1")
	}
}

// syncInit copies the guest init binary, and the spawner program when there is one, into
// StateDir/init/ (the folder mounted at /.sbx, as init and spawn) when they differ (size or
// modification time) from the copies there.
func (d *Driver) syncInit() error {
	d.initMu.Lock()
	defer d.initMu.Unlock()
	if err := d.syncFile(d.opts.InitBinary, "init", "guest init"); err != nil {
		return err
	}
	if d.opts.SpawnerBinary == "" {
		return nil
	}
	return d.syncFile(d.opts.SpawnerBinary, "spawn", "spawner program")
}

// syncFile copies the executable src into StateDir/init/name, atomically, unless the copy
// there has its size and modification time.
func (d *Driver) syncFile(srcPath, name, what string) error {
	src, err := os.Open(srcPath)
	if err != nil {
		return fmt.Errorf("gvisor: %s: %w", what, err)
	}
	defer src.Close()
	sfi, err := src.Stat()
	if err != nil {
		return fmt.Errorf("gvisor: %s: %w", what, err)
	}
	dst := filepath.Join(d.initDir, name)
	if dfi, err := os.Stat(dst); err == nil && dfi.Size() == sfi.Size() && dfi.ModTime().Equal(sfi.ModTime()) {
		return nil
	}
	tmp, err := os.CreateTemp(d.initDir, "."+name+".tmp*")
	if err != nil {
		return fmt.Errorf("gvisor: copy %s: %w", what, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return fmt.Errorf("gvisor: copy %s: %w", what, err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chtimes(tmp.Name(), sfi.ModTime(), sfi.ModTime()); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
