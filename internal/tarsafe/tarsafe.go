// Package tarsafe holds the rules that keep a tar stream's entries inside the tree they are
// extracted into, shared by everything that reads a tree as tar: the bootstrap sources
// (internal/source), which check and normalize an archive before it reaches a sandbox, and the
// guest init's workspace import (guest/server), which checks every stream again while it
// extracts it.
//
// The rules:
//   - A name (an entry's, or a hard link's target) is not empty, holds no NUL, is relative,
//     does not climb out of the root through "..", and has no component longer than
//     MaxComponentBytes; CleanName also bounds the whole name by MaxPathBytes (CleanDeepName,
//     for a workspace's own tar, does not). A name is used clean ("./a//b" is "a/b", "." the
//     root).
//   - An entry is a regular file, a directory, a symlink or a hard link; a device, FIFO,
//     socket or any other type is refused (CheckType).
//   - Nothing climbs out of the root (Escapes): no name, and no relative symlink target read
//     from the link's folder (unless the import is asked to keep links out of the workspace).
//
// Both readers also refuse a hard link to anything but an earlier regular file and any entry
// below (or a directory in the place of) a symlink of the same stream; each checks that
// against its own state (the names seen so far, the files extracted so far). Their other
// symlink rules differ on purpose: the sources refuse absolute targets and targets that go
// through another link, while the import keeps absolute targets under /workspace (and, when
// asked, any), because restoring a workspace has to bring back the links it held.
//
// Standard library only, so that the guest init (a static binary inside every sandbox) can link
// it.
package tarsafe

import (
	"archive/tar"
	"errors"
	"fmt"
	"path"
	"strings"
)

// Linux's bounds of a path (PATH_MAX) and of one of its components (NAME_MAX).
const (
	MaxPathBytes      = 4096
	MaxComponentBytes = 255
)

// Why a name is refused. Each reads as the predicate of the entry it is about
// (`archive entry "x" has an empty name`).
var (
	ErrEmptyName        = errors.New("has an empty name")
	ErrNULInName        = errors.New("has a NUL byte in its name")
	ErrNameTooLong      = errors.New("has a name longer than 4096 bytes")
	ErrAbsolute         = errors.New("has an absolute path")
	ErrEscapes          = errors.New("escapes the root (..)")
	ErrComponentTooLong = errors.New("has a path component longer than 255 bytes")
)

// CleanName validates a tar entry's name (or a hard link's target) and cleans it: not empty,
// no NUL, at most MaxPathBytes, relative, no escape through "..", no component (of the clean
// name) longer than MaxComponentBytes. It returns the clean name ("." for the root), or one of
// the Err… name errors above and "".
func CleanName(n string) (string, error) {
	return cleanName(n, MaxPathBytes)
}

// CleanDeepName is CleanName without the bound on the whole name, for the tar of a workspace
// (a checkpoint being restored): a workspace may hold paths longer than PATH_MAX, made one
// folder at a time, which its export writes and its restore has to bring back. Every other
// check is CleanName's, components included (no file system holds a longer one).
func CleanDeepName(n string) (string, error) {
	return cleanName(n, 0)
}

// cleanName is CleanName with a bound on the whole name (0: none). The checks run in a fixed
// order, so a name with several faults is always refused for the same one.
func cleanName(n string, maxBytes int) (string, error) {
	switch {
	case n == "":
		return "", ErrEmptyName
	case strings.IndexByte(n, 0) >= 0:
		return "", ErrNULInName
	case maxBytes > 0 && len(n) > maxBytes:
		return "", ErrNameTooLong
	case strings.HasPrefix(n, "/"):
		return "", ErrAbsolute
	}
	c := path.Clean(n)
	if Escapes(c) {
		return "", ErrEscapes
	}
	for comp := range strings.SplitSeq(c, "/") {
		if len(comp) > MaxComponentBytes {
			return "", ErrComponentTooLong
		}
	}
	return c, nil
}

// Escapes reports whether the clean relative path p climbs out of its root: ".." or below it.
func Escapes(p string) bool {
	return p == ".." || strings.HasPrefix(p, "../")
}

// TypeSocket is the type flag of an entry that is a socket: tar has none, but a zip archive can
// hold one.
const TypeSocket = 's'

// Why CheckType refuses a special file, as the entry's predicate.
var (
	ErrCharDevice  = errors.New("is a character device")
	ErrBlockDevice = errors.New("is a block device")
	ErrFIFO        = errors.New("is a FIFO")
	ErrSocket      = errors.New("is a socket")
)

// UnsupportedTypeError is CheckType's refusal of any other type.
type UnsupportedTypeError struct {
	Type byte
}

func (e *UnsupportedTypeError) Error() string {
	return fmt.Sprintf("has the unsupported type %q", string(e.Type))
}

// CheckType admits the entries a tree may hold, a regular file, a directory, a symlink or a hard
// link (by their tar type flags), and refuses every other: a device, FIFO or socket as what it
// is (ErrCharDevice, ErrBlockDevice, ErrFIFO, ErrSocket), anything else as an
// *UnsupportedTypeError. Encodings of a regular file that a reader decodes (GNU sparse files)
// are the reader's to map to tar.TypeReg first.
func CheckType(flag byte) error {
	switch flag {
	case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
		return nil
	case tar.TypeChar:
		return ErrCharDevice
	case tar.TypeBlock:
		return ErrBlockDevice
	case tar.TypeFifo:
		return ErrFIFO
	case TypeSocket:
		return ErrSocket
	}
	return &UnsupportedTypeError{Type: flag}
}
