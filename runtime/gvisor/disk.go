package gvisor

// A box's disk: its workspace lives on an ext4 file system of its own, in a sparse image file
// attached to a loop device, so BoxSpec.DiskBytes is enforced by the kernel.
//
//	StateDir/boxes/<id>/disk.img             the image: a sparse file of DiskBytes
//	StateDir/boxes/<id>/disk/                where the image is mounted (nosuid, nodev, discard)
//	StateDir/boxes/<id>/disk/workspace/      the workspace, bound at /workspace in the box
//	                                         (a sub-folder, so ext4's lost+found stays out of it)
//
// Why a loop-mounted ext4 image, and not the alternatives:
//   - Project quotas (ext4/xfs prjquota) need the host file system that holds StateDir to be
//     made and mounted with project quotas. A zero-setup local runtime cannot ask that of
//     whatever disk /var/lib is on, and without it nothing is enforced at all.
//   - gVisor's own limits (--overlay2 with a size, tmpfs size=) cover the sandbox's root
//     overlay and memory-backed mounts, not a bind-mounted host folder. The workspace has to
//     stay a host folder: it outlives the sandbox across stop/start and host restarts, and the
//     driver checkpoints it from the host (ExportWorkspace), also when the sandbox has died.
//   - A loop-mounted image works on any host file system with sparse files, needs nothing but
//     root and e2fsprogs, and holds for every path a byte can take into the workspace (a
//     command, the files API, a restore, a bootstrap import): the kernel answers ENOSPC, and
//     statfs inside the box (gVisor's gofer passes it through) shows the disk's own size. The
//     host keeps at most the image's apparent size (DiskBytes): never more than the limit.
//     Mounted with `discard`, deleted files give their space back to the host (the loop device
//     punches holes in the image). It is what a PVC of that size is on Kubernetes.
//   - Costs: about 8 ms of mkfs.ext4 per disk (off a create's path: diskpool.go keeps a
//     formatted image ready), 1 ms to attach and mount per create or start, 2 ms to unmount
//     per stop (medians on a 2-core machine), one loop device per box whose disk is mounted
//     (running or failed boxes; stop unmounts), and ext4's own metadata (journal, inode
//     tables): df shows the disk less that, about 2.5% of a 10 GiB disk, 15% of a 64 MiB one.
//   - The box never sees the image as a block device, only files through gVisor's gofer, so
//     the host kernel only ever mounts an image its own ext4 wrote: no tenant-crafted file
//     system image reaches the kernel's ext4 parser.
//
// The image is attached with the loop ioctls (LOOP_CTL_GET_FREE, LOOP_CONFIGURE) and mounted
// with mount(2) rather than by running `mount -o loop` (about 5 ms here, against 1 ms): it saves
// a process per mount, does not depend on util-linux, and makes every error path leak-free by
// construction: the loop device is configured with LO_FLAGS_AUTOCLEAR, so it is freed when its
// last user goes, be that the driver's descriptor after a failed mount or the file system's
// unmount. Only mkfs.ext4 runs as a process (there is no maintained ext4 formatter in Go).

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/guest/server"
	"sandboxd/runtime"
)

// Disk sizes.
const (
	// DefaultDiskBytes is the size of a box's disk when its spec sets none (DiskBytes 0): the
	// default profile's 10 GiB. 0 never means "unlimited": the image is sparse, so a large
	// default costs the host only what the box writes.
	DefaultDiskBytes = 10 << 30
	// MinDiskBytes is the smallest disk the driver makes: ext4 with a journal needs room.
	MinDiskBytes = 16 << 20
)

// Names of a box's disk under its folder.
const (
	diskImageFile = "disk.img"
	diskMountDn   = "disk"
	// legacyWorkspaceDn is where a box made before disks kept its workspace (workspaceDn at the
	// box folder's top); Start moves it aside.
	legacyWorkspaceDn = "workspace.legacy"
)

// loopMajor is the block device major number of loop devices.
const loopMajor = 7

// disks makes, mounts and unmounts the boxes' workspace disks, and keeps the pool of
// formatted images (diskpool.go) that a new disk is taken from. It holds no lock of its own:
// the driver calls it under the box's lifecycle mutex.
type disks struct {
	boxes        *boxStore // where each box's image and mount point are
	mkfs         string    // Options.Mkfs
	defaultBytes int64     // Options.DefaultDiskBytes
	log          *slog.Logger
	pool         *diskPool
}

func (d *disks) diskImage(id string) string { return d.boxes.boxPath(id, diskImageFile) }
func (d *disks) diskMount(id string) string { return d.boxes.boxPath(id, diskMountDn) }

// workspacePath is the host folder bound at /workspace: a sub-folder of the box's disk.
func (d *disks) workspacePath(id string) string {
	return filepath.Join(d.diskMount(id), workspaceDn)
}

// diskBytes is the size of the disk a spec asks for.
func (d *disks) diskBytes(spec runtime.BoxSpec) int64 {
	if spec.DiskBytes > 0 {
		return spec.DiskBytes
	}
	return d.defaultBytes
}

// validateDisk refuses a disk size the driver cannot make.
func validateDisk(spec runtime.BoxSpec) error {
	if spec.DiskBytes < 0 {
		return fmt.Errorf("gvisor: negative disk size in spec")
	}
	if spec.DiskBytes > 0 && spec.DiskBytes < MinDiskBytes {
		return fmt.Errorf("gvisor: disk of %d bytes is below the %d MiB a workspace disk needs", spec.DiskBytes, MinDiskBytes>>20)
	}
	return nil
}

// findMkfs returns the path of mkfs.ext4: in PATH, else in the sbin folders a service's PATH
// may lack.
func findMkfs() (string, error) {
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
		if isExecutableFile(p) {
			return p, nil
		}
	}
	return "", errors.New("gvisor: mkfs.ext4 not found: install e2fsprogs (scripts/run-server.sh does)")
}

// ensureDisk makes the box's disk when it has none, mounts it when it is not mounted (a host
// reboot unmounted it, a stop did) and makes the workspace folder on it when missing. fresh
// reports a workspace that was made empty here. A disk this call mounted is unmounted again
// when it fails.
func (d *disks) ensureDisk(ctx context.Context, id string, spec runtime.BoxSpec) (fresh bool, err error) {
	img := d.diskImage(id)
	if _, err := os.Stat(img); errors.Is(err, fs.ErrNotExist) {
		if err := d.moveLegacyWorkspace(id); err != nil {
			return false, err
		}
		if err := d.makeDisk(ctx, img, d.diskBytes(spec)); err != nil {
			return false, err
		}
		fresh = true
	} else if err != nil {
		return false, fmt.Errorf("gvisor: disk of %s: %w", id, err)
	}
	mounted, err := d.mountDisk(id)
	if err != nil {
		return false, err
	}
	defer func() {
		if err != nil && mounted {
			if uerr := d.unmountDisk(id); uerr != nil {
				d.log.Error("unmounting a disk after a failed set-up", "box", id, "err", uerr)
			}
		}
	}()
	ws := d.workspacePath(id)
	if _, err := os.Lstat(ws); errors.Is(err, fs.ErrNotExist) {
		if err := os.Mkdir(ws, 0o755); err != nil {
			return false, fmt.Errorf("gvisor: create workspace: %w", err)
		}
		fresh = true
	} else if err != nil {
		return false, fmt.Errorf("gvisor: workspace: %w", err)
	}
	return fresh, nil
}

// exportableWorkspace returns the host folder of a box's workspace for reading. A disk that is
// not mounted (a stopped box's; a failed one's after a host reboot) is mounted for the read:
// release, called once the reading is done, unmounts it again, and lifecycle calls on the box
// wait until then, as they do while a stopped box's kept disk (keptmounts.go) is read. A box
// made before disks has its workspace folder read as it is.
func (d *Driver) exportableWorkspace(id string) (string, func(), error) {
	unlock := d.boxMu.lock(id)
	noWorkspace := fmt.Errorf("gvisor: box %s has no workspace: %w", id, runtime.ErrNotFound)
	if _, err := os.Stat(d.disks.diskImage(id)); errors.Is(err, fs.ErrNotExist) {
		defer unlock()
		legacy := d.boxes.boxPath(id, workspaceDn)
		if _, err := os.Lstat(legacy); errors.Is(err, fs.ErrNotExist) {
			return "", nil, noWorkspace
		} else if err != nil {
			return "", nil, err
		}
		return legacy, func() {}, nil
	} else if err != nil {
		unlock()
		return "", nil, fmt.Errorf("gvisor: disk of %s: %w", id, err)
	}
	mounted, err := d.disks.mountDisk(id)
	if err != nil {
		unlock()
		return "", nil, err
	}
	release := func() {
		if mounted {
			if err := d.disks.unmountDisk(id); err != nil {
				d.log.Error("unmounting a disk mounted for an export", "box", id, "err", err)
			}
		}
		unlock()
	}
	ws := d.disks.workspacePath(id)
	if _, err := os.Lstat(ws); err != nil {
		release()
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil, noWorkspace
		}
		return "", nil, err
	}
	if !mounted && !d.kept.has(id) {
		// A running box's: read while it runs, without holding up its lifecycle.
		unlock()
		return ws, func() {}, nil
	}
	// Mounted here, or kept mounted by its stop: no start, delete or unmount of the box
	// until the read is done.
	return ws, release, nil
}

// moveLegacyWorkspace renames the plain workspace folder of a box made before disks existed
// out of the way (it is kept, never deleted: the box starts fresh and the caller restores its
// latest checkpoint; Delete removes it with the box).
func (d *disks) moveLegacyWorkspace(id string) error {
	old := d.boxes.boxPath(id, workspaceDn)
	if _, err := os.Lstat(old); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := os.Rename(old, d.boxes.boxPath(id, legacyWorkspaceDn)); err != nil {
		return fmt.Errorf("gvisor: move the old workspace folder of %s aside: %w", id, err)
	}
	d.log.Warn("box had a workspace folder without a disk; kept it as "+legacyWorkspaceDn+" and made a disk", "box", id)
	return nil
}

// makeDisk puts a sparse image of size bytes at img, formatted as ext4: one of the pool's
// (diskpool.go), or one formatted now. The caller refills the pool once its box is up (a
// refill meanwhile would compete with runsc for the CPU).
func (d *disks) makeDisk(ctx context.Context, img string, size int64) error {
	if d.mkfs == "" {
		_, err := findMkfs()
		return err
	}
	if d.pool.take(img, size) {
		d.log.Debug("disk taken from the pool", "image", img, "bytes", size)
		return nil
	}
	return d.formatImage(ctx, img, size, false)
}

// formatImage creates a sparse image of size bytes at img, formatted as ext4. It is made under
// a temporary name and renamed into place once formatted, so a crash midway never leaves a
// half-made image where the next start would take it for the box's disk (or the pool for one
// of its images). Nothing is left on failure. background runs mkfs.ext4 at the lowest
// priority.
func (d *disks) formatImage(ctx context.Context, img string, size int64, background bool) (err error) {
	tmp := img + ".new"
	_ = os.Remove(tmp) // a crashed create's
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("gvisor: create disk image: %w", err)
	}
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("gvisor: size disk image: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, cliTimeout)
	defer cancel()
	// -m 0: no blocks reserved for root (the box's root would get them). Lazy inode table and
	// journal initialization and nodiscard: the new image is all holes, which read as zeros
	// already, so nothing is written (the image stays a few MB on the host until used).
	cmd := exec.CommandContext(ctx, d.mkfs, "-q", "-F", "-m", "0",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", tmp)
	var out limitedBuffer
	out.max = 4 << 10
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Start()
	if err == nil {
		if background {
			// A refill of the pool yields the CPU to every box and request.
			_ = unix.Setpriority(unix.PRIO_PROCESS, cmd.Process.Pid, 19)
		}
		err = cmd.Wait()
	}
	if err != nil {
		return fmt.Errorf("gvisor: mkfs.ext4 %s: %w: %s", tmp, err, strings.TrimSpace(out.String()))
	}
	if err := os.Rename(tmp, img); err != nil {
		return fmt.Errorf("gvisor: disk image: %w", err)
	}
	d.log.Debug("disk made", "image", img, "bytes", size, "ms", time.Since(start).Milliseconds())
	return nil
}

// mountDisk mounts the box's image at its mount point unless it is mounted there already (a
// server restart finds the mounts of its running boxes). mounted reports a mount made here.
func (d *disks) mountDisk(id string) (mounted bool, err error) {
	mnt := d.diskMount(id)
	if err := os.Mkdir(mnt, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return false, fmt.Errorf("gvisor: disk mount point: %w", err)
	}
	if ok, err := d.diskMounted(id); err != nil || ok {
		return false, err
	}
	start := time.Now()
	// An earlier mount of the image can outlive its unmount here: one detached lazily
	// (unmountDisk, when the disk stayed busy), or a copy in another mount namespace (a runsc
	// gofer not yet gone) whose superblock our unmount does not end. It holds its loop device
	// until its last user goes: mounting the image again meanwhile would run two ext4
	// instances on one image, the new one blind to what the old one has not written back.
	if err := waitImageFree(d.diskImage(id), imageFreeWait); err != nil {
		return false, fmt.Errorf("gvisor: disk of %s: %w", id, err)
	}
	if waited := time.Since(start); waited >= 50*time.Millisecond {
		d.log.Warn("waited for an earlier mount of the disk's image to end", "box", id, "ms", waited.Milliseconds())
	}
	dev, lf, err := attachLoop(d.diskImage(id))
	if err != nil {
		return false, fmt.Errorf("gvisor: disk of %s: %w", id, err)
	}
	// The loop device clears itself on its last close: on success the mount holds it, on
	// failure closing lf frees it.
	defer lf.Close()
	// discard: deleted files give their space back to the host. noinit_itable: the inode
	// tables of a new image are holes already, no background zeroing needed.
	err = unix.Mount(dev, mnt, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "discard,noinit_itable")
	if err != nil {
		return false, fmt.Errorf("gvisor: mount the disk of %s (%s on %s): %w", id, dev, mnt, err)
	}
	d.log.Debug("disk mounted", "box", id, "dev", dev, "ms", time.Since(start).Milliseconds())
	return true, nil
}

// attachLoop attaches img to a free loop device with LO_FLAGS_AUTOCLEAR and returns the
// device's path and an open descriptor of it; closing that descriptor frees the device unless
// something (a mount) holds it.
func attachLoop(img string) (string, *os.File, error) {
	f, err := os.OpenFile(img, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	defer f.Close() // the loop device holds its own reference to the file
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("loop devices: %w", err)
	}
	defer ctl.Close()
	var last error
	for attempt := 0; attempt < 64; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("loop devices: LOOP_CTL_GET_FREE: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		lf, err := openLoop(dev, n)
		if err != nil {
			return "", nil, err
		}
		err = configureLoop(int(lf.Fd()), int(f.Fd()), img)
		if err == nil {
			return dev, lf, nil
		}
		lf.Close()
		if !errors.Is(err, unix.EBUSY) {
			return "", nil, fmt.Errorf("loop devices: attach %s to %s: %w", img, dev, err)
		}
		// Another process took this device between GET_FREE and CONFIGURE: take the next.
		last = err
	}
	return "", nil, fmt.Errorf("loop devices: no free device after 64 attempts: %w", last)
}

// openLoop opens loop device n, making its device node when the kernel made the device but
// /dev has no node for it (a static /dev in a container).
func openLoop(dev string, n int) (*os.File, error) {
	lf, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		if merr := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(loopMajor, uint32(n)))); merr != nil && !errors.Is(merr, fs.ErrExist) {
			return nil, fmt.Errorf("loop devices: make %s: %w", dev, merr)
		}
		lf, err = os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("loop devices: %w", err)
	}
	return lf, nil
}

// configureLoop binds the loop device loopFd to the file fileFd with LOOP_CONFIGURE (Linux
// 5.8), or LOOP_SET_FD and LOOP_SET_STATUS64 on older kernels.
func configureLoop(loopFd, fileFd int, name string) error {
	var info unix.LoopInfo64
	info.Flags = unix.LO_FLAGS_AUTOCLEAR
	copy(info.File_name[:len(info.File_name)-1], name)
	err := unix.IoctlLoopConfigure(loopFd, &unix.LoopConfig{Fd: uint32(fileFd), Info: info})
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) {
		return err
	}
	if err := unix.IoctlSetInt(loopFd, unix.LOOP_SET_FD, fileFd); err != nil {
		return err
	}
	if err := unix.IoctlLoopSetStatus64(loopFd, &info); err != nil {
		_ = unix.IoctlSetInt(loopFd, unix.LOOP_CLR_FD, 0)
		return err
	}
	return nil
}

// checkDisks reports whether the driver can make and mount disks: mkfs.ext4 and the loop
// control device are there.
func (d *disks) checkDisks() error {
	if d.mkfs == "" {
		_, err := findMkfs()
		return err
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return fmt.Errorf("gvisor: loop devices: %w (the loop module is needed for workspace disks)", err)
	}
	return nil
}

// diskMounted reports whether the box's image is mounted at its mount point. Something else
// mounted there is an error: the driver never binds a workspace it cannot vouch for.
func (d *disks) diskMounted(id string) (bool, error) {
	dev, ok, err := d.mountedDevice(id)
	if err != nil || !ok {
		return false, err
	}
	if ok, err := loopBacks(dev, d.diskImage(id)); err != nil || !ok {
		if err == nil {
			err = errors.New("it is not the box's disk image")
		}
		return false, fmt.Errorf("gvisor: %s holds a mount the driver did not make: %w", d.diskMount(id), err)
	}
	return true, nil
}

// mountedDevice returns the device of what is mounted at the box's mount point; ok is false
// when nothing is.
func (d *disks) mountedDevice(id string) (dev uint64, ok bool, err error) {
	var mst, pst unix.Stat_t
	mnt := d.diskMount(id)
	if err := unix.Stat(mnt, &mst); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("gvisor: disk mount point: %w", &fs.PathError{Op: "stat", Path: mnt, Err: err})
	}
	if err := unix.Stat(d.boxes.boxDir(id), &pst); err != nil {
		return 0, false, fmt.Errorf("gvisor: box folder: %w", err)
	}
	return mst.Dev, mst.Dev != pst.Dev, nil
}

// imageFreeWait is how long a mount waits for an earlier, lazily detached mount of the same
// image to end.
const imageFreeWait = 30 * time.Second

// waitImageFree waits until no loop device is backed by img, for at most within.
func waitImageFree(img string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		dev, err := loopOf(img)
		if err != nil || dev == "" {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the image is still attached to %s (an earlier mount, detached lazily, is still in use): try again later", dev)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// loopOf returns a loop device backed by img ("" when none is).
func loopOf(img string) (string, error) {
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return "", err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the device was cleared meanwhile
		}
		if sameFilePath(strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)"), img) {
			return "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(f))), nil
		}
	}
	return "", nil
}

// loopBacks reports whether the block device dev is a loop device whose backing file is img.
func loopBacks(dev uint64, img string) (bool, error) {
	if unix.Major(dev) != loopMajor {
		return false, nil
	}
	backing, err := loopBackingFile(dev)
	if err != nil {
		return false, err
	}
	return sameFilePath(backing, img), nil
}

// loopBackingFile is the path the loop device dev names as its backing file (with " (deleted)"
// after it when that file was removed).
func loopBackingFile(dev uint64) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/loop/backing_file", unix.Major(dev), unix.Minor(dev)))
	return strings.TrimSpace(string(b)), err
}

// sameFilePath reports whether paths a and b name the same file (device and inode).
func sameFilePath(a, b string) bool {
	var sa, sb unix.Stat_t
	return unix.Stat(a, &sa) == nil && unix.Stat(b, &sb) == nil && sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// dropStaleMount unmounts what a box's mount point holds of a disk image that has since been
// removed from the box's folder (deleted, or replaced by another file): a disk a stop kept
// mounted (keptmounts.go) whose image was then lost. Only called while the box has no
// container. Any other mount there is left for diskMounted to refuse.
func (d *disks) dropStaleMount(id string) error {
	dev, ok, err := d.mountedDevice(id)
	if err != nil || !ok || unix.Major(dev) != loopMajor {
		return err
	}
	b, err := loopBackingFile(dev)
	if err != nil {
		return nil
	}
	backing, gone := strings.CutSuffix(b, " (deleted)")
	if !gone || filepath.Base(backing) != diskImageFile || !sameFilePath(filepath.Dir(backing), d.boxes.boxDir(id)) {
		return nil
	}
	d.log.Warn("the disk image of a stopped box is gone: unmounting what was mounted of it", "box", id)
	if err := d.unmountOnce(id); err != nil {
		return fmt.Errorf("gvisor: unmount the gone disk image of %s: %w", id, err)
	}
	return nil
}

// unmountDisk unmounts the box's disk (every mount of it stacked there); the loop device goes
// with the last one. A disk still busy after a short wait is detached lazily: the kernel
// unmounts it, and frees its loop device, once the last open file on it is closed.
func (d *disks) unmountDisk(id string) error {
	for range 16 {
		ok, err := d.diskMounted(id)
		if err != nil || !ok {
			return err
		}
		if err := d.unmountOnce(id); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("gvisor: unmount the disk of %s: %w", id, err)
		}
	}
	if ok, err := d.diskMounted(id); err != nil || !ok {
		return err
	}
	return fmt.Errorf("gvisor: the disk of %s is still mounted after 16 unmounts", id)
}

// unmountOnce unmounts the top mount at the box's mount point, waiting up to 200 ms while it is
// busy, then detaching it lazily.
func (d *disks) unmountOnce(id string) error {
	mnt := d.diskMount(id)
	err := unix.Unmount(mnt, 0)
	for wait := 0; errors.Is(err, unix.EBUSY) && wait < 10; wait++ {
		time.Sleep(20 * time.Millisecond)
		err = unix.Unmount(mnt, 0)
	}
	if errors.Is(err, unix.EBUSY) {
		d.log.Warn("disk busy, detaching it lazily", "box", id)
		err = unix.Unmount(mnt, unix.MNT_DETACH)
	}
	return err
}

// seed extracts a workspace tar into the box's mounted workspace before its container starts,
// with the guest import's rules (guest/server.ImportTar), bounded by the box's disk. gVisor
// caches what it sees of a folder, so this is only ever done while no container runs.
func (d *Driver) seed(ctx context.Context, id string, spec runtime.BoxSpec, seed runtime.Seed) error {
	start := time.Now()
	r, err := seed(ctx)
	if err != nil {
		return &runtime.SeedError{Err: err}
	}
	defer r.Close()
	res, err := server.ImportTar(d.disks.workspacePath(id), r, server.ImportTarOptions{Replace: true,
		MaxBytes: d.disks.diskBytes(spec), AllowExternalSymlinks: true, Writers: goruntime.GOMAXPROCS(0)})
	if err != nil {
		return &runtime.SeedError{Err: err}
	}
	d.log.Debug("workspace seeded on the host", "box", id, "files", res.Files, "bytes", res.Bytes,
		"ms", time.Since(start).Milliseconds())
	return nil
}
