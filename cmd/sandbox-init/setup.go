package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// What PID 1 does with the privileges it starts with. The local runtime starts it with
// CAP_SYS_ADMIN on top of the commands' capability set, for what only a privileged PID 1 can
// do before any workload exists: open the cgroups that track each exec's processes, hide the
// exec state folder and the host socket's folder, refuse mounts from then on, and nothing
// else. Then it drops CAP_SYS_ADMIN from its effective, permitted and bounding sets on every
// thread, so no command it starts (and no later code of its own) holds it. A runtime that
// starts PID 1 without it (Kubernetes under PodSecurity baseline) simply skips those steps.

// capSysAdmin is CAP_SYS_ADMIN's bit number.
const capSysAdmin = 21

// hasCap reports whether this thread's effective set holds capability c.
func hasCap(c uint) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[c/32].Effective&(1<<(c%32)) != 0
}

// dropCap removes capability c from the effective, permitted and inheritable sets of every
// thread of the process (capabilities are per thread), and from the bounding set of every
// thread when allBounding is set. The bounding set only matters at execve: where every command
// is forked from the exec spawner's thread, which drops c from its own bounding set
// (server.Cgroups), the other threads' bounding sets are left alone (an all-threads call costs
// about 2 ms in gVisor).
func dropCap(c uint, allBounding bool) error {
	if allBounding {
		if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err != nil || in == 1 {
			if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); e != 0 {
				return fmt.Errorf("dropping capability %d from the bounding set: %w", c, e)
			}
		}
	}
	return setCaps(func(d *unix.CapUserData, word uint) {
		if c/32 == word {
			bit := uint32(1) << (c % 32)
			d.Effective &^= bit
			d.Permitted &^= bit
			d.Inheritable &^= bit
		}
	}, c)
}

// clearCaps empties the effective, permitted and inheritable sets of every thread: what
// `connect` does (it starts no program, so its bounding set does not matter).
func clearCaps() error {
	return setCaps(func(d *unix.CapUserData, _ uint) { *d = unix.CapUserData{} }, capSysAdmin)
}

// setCaps applies edit to the two words of the thread's capability sets, sets the result on
// every thread and checks that check is no longer effective.
func setCaps(edit func(d *unix.CapUserData, word uint), check uint) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	for i := range data {
		edit(&data[i], uint(i))
	}
	hdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	if hasCap(check) {
		return fmt.Errorf("capability %d is still effective after dropping it", check)
	}
	return nil
}

// notDumpable makes the process non-dumpable: another process of the box, even one running
// as root, can then neither ptrace it nor read its /proc/<pid>/environ, mem, fd or root
// (gVisor applies the same rule as Linux; checked with real runsc). It is how PID 1 keeps the
// channel key to itself.
func notDumpable() error {
	return unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
}

// hideDir mounts an empty, read-only tmpfs over dir. PID 1 does this to the folder of its host
// socket once it listens there: the listening socket keeps working (the runtime connects to
// it on the host), but nothing in the box can reach the folder any more to replace the socket,
// plant a link or fill the host's disk through it, and a command cannot unmount it without
// CAP_SYS_ADMIN. (A lazy unmount instead breaks the listening socket under gVisor.)
func hideDir(dir string) error {
	dir = filepath.Clean(dir)
	if dir == "/" || dir == "." {
		return errors.New("refusing to hide the root folder")
	}
	return unix.Mount("tmpfs", dir, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0555")
}

// hideStateDir makes the exec state folder (the exec logs), opens it and hides it (hideDir).
// PID 1 then works in it through the descriptor, by the returned path /proc/self/fd/<dir>
// (close-on-exec, and PID 1 is not dumpable: no command can follow it), while every command
// sees an empty read-only folder. A command runs as root in the box: without this it could
// remove, replace or rewrite its own exec's log under PID 1 and the replicas that follow it.
func hideStateDir(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("opening %s: %w", dir, err)
	}
	if err := hideDir(dir); err != nil {
		_ = unix.Close(fd)
		return "", err
	}
	return "/proc/self/fd/" + strconv.Itoa(fd), nil
}

// isAbstract reports whether a unix socket address names the abstract namespace ("@name"):
// such a socket has no file, so nothing can unlink, replace or link it, and a second bind of
// the name fails while PID 1 holds it.
func isAbstract(addr string) bool { return len(addr) > 0 && addr[0] == '@' }

// chmodSocket restricts a socket file to root (nothing to do for an abstract socket).
func chmodSocket(addr string) {
	if !isAbstract(addr) {
		_ = os.Chmod(addr, 0o600)
	}
}
