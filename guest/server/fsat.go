package server

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"sandboxd/guest/proto"
)

// The file operations act on directory file descriptors (the *at system calls) reached one
// component at a time, each opened with O_PATH|O_NOFOLLOW and checked to be a directory: a
// symlink a command swaps in for a directory between a check and the act makes the walk fail
// (the O_PATH fd is the link itself, which is no directory), it is never followed. O_PATH
// opens nothing (a device or FIFO is not opened), and O_DIRECTORY is never combined with
// O_NOFOLLOW on a name (gVisor follows the link then; see resolveIn).

// errChanged is a walk that met something else than a directory where the resolution had seen
// one: a command replaced it meanwhile.
var errChanged = errors.New("the path changed while it was being resolved (a component was replaced)")

// dirFD is an O_PATH descriptor of a directory of the workspace.
type dirFD int

func (d dirFD) close() { _ = unix.Close(int(d)) }

// openRootFD opens the workspace itself.
func (s *Server) openRootFD() (dirFD, error) {
	fd, err := retryEINTR(func() (int, error) {
		return unix.Open(s.ws, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	})
	return dirFD(fd), err
}

// openDirAt opens the one component name of dir without following a link, and checks that
// it is a directory: a symlink is errChanged (ELOOP in its chain), anything else ENOTDIR.
func openDirAt(dir dirFD, name string) (dirFD, error) {
	fd, err := retryEINTR(func() (int, error) {
		return unix.Openat(int(dir), name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	})
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		_ = unix.Close(fd)
		return -1, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return dirFD(fd), nil
	case unix.S_IFLNK:
		_ = unix.Close(fd)
		return -1, errors.Join(errChanged, syscall.ELOOP)
	}
	_ = unix.Close(fd)
	return -1, syscall.ENOTDIR
}

// walkDir opens the directory rel (a clean relative path without symlinks, as resolveIn
// returns it; "." is root) from root, one component at a time. The caller closes it.
func walkDir(root dirFD, rel string) (dirFD, error) {
	cur, err := dupFD(root)
	if err != nil {
		return -1, err
	}
	if rel == "." || rel == "" {
		return cur, nil
	}
	for part := range strings.SplitSeq(rel, "/") {
		next, err := openDirAt(cur, part)
		cur.close()
		if err != nil {
			return -1, err
		}
		cur = next
	}
	return cur, nil
}

func dupFD(d dirFD) (dirFD, error) {
	fd, err := unix.FcntlInt(uintptr(d), unix.F_DUPFD_CLOEXEC, 0)
	return dirFD(fd), err
}

// lstatAt is fstatat(dir, name, AT_SYMLINK_NOFOLLOW).
func lstatAt(dir dirFD, name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	_, err := retryEINTR(func() (int, error) {
		return 0, unix.Fstatat(int(dir), name, &st, unix.AT_SYMLINK_NOFOLLOW)
	})
	return st, err
}

// readlinkAt reads the target of the symlink name in dir.
func readlinkAt(dir dirFD, name string) (string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(int(dir), name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// readDirNames lists dir, at most max names when max > 0 (then more reports that there were
// more). It opens "." of the O_PATH descriptor for reading (no name is followed).
func readDirFD(dir dirFD, max int) (names []string, more bool, err error) {
	fd, err := retryEINTR(func() (int, error) {
		return unix.Openat(int(dir), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	})
	if err != nil {
		return nil, false, err
	}
	f := os.NewFile(uintptr(fd), "dir")
	defer f.Close()
	for {
		batch, err := f.Readdirnames(256)
		for _, n := range batch {
			if max > 0 && len(names) == max {
				return names, true, nil
			}
			names = append(names, n)
		}
		if err == io.EOF || len(batch) == 0 {
			return names, false, nil
		}
		if err != nil {
			return names, false, err
		}
	}
}

// maxRemoveDepth bounds how deep removeTree descends (each level holds one descriptor).
const maxRemoveDepth = 4096

// removeTree removes name in dir and, when it is a directory, everything below it, without
// ever following a symlink: entries are unlinked by name in their parent's descriptor, and a
// directory is entered only through openDirAt. It stops early when ctx ends. yield is called
// after every batch of entries (the background remover's chance to let other work run).
func removeTree(ctx context.Context, dir dirFD, name string, yield func()) error {
	return removeTreeDepth(ctx, dir, name, yield, 0)
}

func removeTreeDepth(ctx context.Context, dir dirFD, name string, yield func(), depth int) error {
	err := unix.Unlinkat(int(dir), name, 0)
	if err == nil || errors.Is(err, syscall.ENOENT) {
		return nil
	}
	if !errors.Is(err, syscall.EISDIR) && !errors.Is(err, syscall.EPERM) {
		return err
	}
	if depth >= maxRemoveDepth {
		return errors.New("the tree is deeper than the guest removes")
	}
	sub, err := openDirAt(dir, name)
	if err != nil {
		if errors.Is(err, errChanged) {
			// Replaced by a symlink meanwhile: remove the link, never what it points to.
			return unix.Unlinkat(int(dir), name, 0)
		}
		return err
	}
	for {
		if err := ctx.Err(); err != nil {
			sub.close()
			return err
		}
		names, more, err := readDirFD(sub, 512)
		if err != nil {
			sub.close()
			return err
		}
		for _, n := range names {
			if err := removeTreeDepth(ctx, sub, n, yield, depth+1); err != nil {
				sub.close()
				return err
			}
		}
		if yield != nil {
			yield()
		}
		if !more {
			break
		}
	}
	sub.close()
	err = unix.Unlinkat(int(dir), name, unix.AT_REMOVEDIR)
	if errors.Is(err, syscall.ENOENT) {
		return nil
	}
	return err
}

func retryEINTR(f func() (int, error)) (int, error) {
	for {
		n, err := f()
		if !errors.Is(err, syscall.EINTR) {
			return n, err
		}
	}
}

// fileType names the kind of file of a stat mode (proto.FileType…).
func fileTypeOf(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return proto.FileTypeFile
	case unix.S_IFDIR:
		return proto.FileTypeDir
	case unix.S_IFLNK:
		return proto.FileTypeSymlink
	case unix.S_IFSOCK:
		return proto.FileTypeSocket
	case unix.S_IFIFO:
		return proto.FileTypeFIFO
	case unix.S_IFCHR:
		return proto.FileTypeCharDev
	case unix.S_IFBLK:
		return proto.FileTypeBlockDev
	}
	return proto.FileTypeIrregular
}

// fileTypeOfMode is fileTypeOf for Go's mode bits.
func fileTypeOfMode(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return proto.FileTypeFile
	case m.IsDir():
		return proto.FileTypeDir
	case m&fs.ModeSymlink != 0:
		return proto.FileTypeSymlink
	case m&fs.ModeSocket != 0:
		return proto.FileTypeSocket
	case m&fs.ModeNamedPipe != 0:
		return proto.FileTypeFIFO
	case m&fs.ModeCharDevice != 0:
		return proto.FileTypeCharDev
	case m&fs.ModeDevice != 0:
		return proto.FileTypeBlockDev
	}
	return proto.FileTypeIrregular
}
