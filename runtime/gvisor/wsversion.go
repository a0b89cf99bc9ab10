package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// WorkspaceVersion implements runtime.WorkspaceExporter's for a box whose disk is mounted.
//
// The version is the host's boot, the mount's unique id (statx's STATX_MNT_ID_UNIQUE: never
// reused while the host runs, so a remount or another disk never matches) and the count of
// sectors written to the disk's loop device. Every change in the workspace (data, a name, a
// mode, a time) is a write of the ext4 on that device, by the box's gofer or by the host: once
// written back, it moves the count. A write still in the page cache does not yet, so a version
// that equals since is checked again after syncfs writes the file system back. A device whose
// I/O statistics are off (queue/iostats 0), a kernel without unique mount ids or a box without
// a disk (a workspace folder of an older sandboxd) have no version. settle writes the file
// system back before the count is read.
func (d *Driver) WorkspaceVersion(ctx context.Context, id, since string, settle bool) (string, bool, error) {
	if err := checkID(id); err != nil {
		return "", false, err
	}
	// The open descriptor holds the mount (and its unique id) for the reads below: the box's
	// lock is held only to open it, so that an export of the workspace meanwhile (which takes
	// the lock too) runs beside the write-back.
	unlock := d.boxMu.lock(id)
	f, err := os.OpenFile(d.disks.diskMount(id), os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	unlock()
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("gvisor: the disk of %s: %w", id, err)
	}
	defer f.Close()
	img := d.disks.diskImage(id)
	if !settle {
		// A count that differs already needs no write-back to tell; one that matches is read
		// again after it.
		v, err := diskVersion(f, img)
		if err != nil || v == "" || v != since {
			return v, false, err
		}
	}
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return "", false, fmt.Errorf("gvisor: write back the disk of %s: %w", id, &fs.PathError{Op: "syncfs", Path: f.Name(), Err: err})
	}
	v, err := diskVersion(f, img)
	if err != nil {
		return "", false, err
	}
	return v, v != "" && v == since, nil
}

// diskVersion is the version (WorkspaceVersion) of the file system mounted at dir, the root
// of a mount of the loop device backed by img; "" when it is not, or cannot be told.
func diskVersion(dir *os.File, img string) (string, error) {
	var stx unix.Statx_t
	if err := unix.Statx(int(dir.Fd()), "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID_UNIQUE, &stx); err != nil {
		return "", fmt.Errorf("gvisor: %w", &fs.PathError{Op: "statx", Path: dir.Name(), Err: err})
	}
	if stx.Mask&unix.STATX_MNT_ID_UNIQUE == 0 || stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 ||
		stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return "", nil // a kernel before 6.8, or nothing mounted there
	}
	dev := unix.Mkdev(stx.Dev_major, stx.Dev_minor)
	if ok, err := loopBacks(dev, img); err != nil || !ok {
		return "", err
	}
	sysfs := fmt.Sprintf("/sys/dev/block/%d:%d/", stx.Dev_major, stx.Dev_minor)
	on, err := os.ReadFile(sysfs + "queue/iostats")
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(string(on)) != "1" {
		return "", nil
	}
	stat, err := os.ReadFile(sysfs + "stat")
	if err != nil {
		return "", err
	}
	// Documentation/block/stat.rst: the 7th field is the sectors written.
	f := strings.Fields(string(stat))
	if len(f) < 7 {
		return "", fmt.Errorf("gvisor: %sstat: %d fields", sysfs, len(f))
	}
	boot, err := bootID()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s/%d/%s", boot, stx.Mnt_id, f[6]), nil
}

// bootID is the host's boot id: unique mount ids and the devices' counts start again at a
// boot.
var bootID = sync.OnceValues(func() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b)), err
})
