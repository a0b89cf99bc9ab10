package server

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"

	"sandboxd/guest/proto"
)

// errEscapes is a path that resolves outside the root.
var errEscapes = errors.New("path escapes the workspace")

// maxSymlinks bounds the symlinks followed while resolving one path (Linux's limit).
const maxSymlinks = 40

// resolveIn resolves every symlink in rel (a clean relative path), the last component too
// when followLast, inside root, and returns a path whose components (but a last one that is a
// link, when !followLast) are no symlinks. Absolute link targets are turned into paths of the
// root by mapAbs (nil: refused); anything that leaves the root is errEscapes. A missing
// component ends the resolution: the rest is joined lexically.
//
// Why not os.Root alone: os.Root steps into each directory with openat(O_NOFOLLOW |
// O_DIRECTORY) and relies on the kernel refusing a symlink there. gVisor (runsc 2026-09)
// follows the symlink instead, so os.Root would walk through "link -> /etc" out of the root.
// Giving os.Root paths without symlinks keeps it inside on both kernels.
func resolveIn(root *os.Root, rel string, followLast bool, mapAbs func(string) (string, bool)) (string, error) {
	pending := splitPath(rel)
	var done []string
	links := 0
	for len(pending) > 0 {
		name := pending[0]
		pending = pending[1:]
		switch name {
		case ".":
			continue
		case "..":
			if len(done) == 0 {
				return "", errEscapes
			}
			done = done[:len(done)-1]
			continue
		}
		cur := path.Join(append(done, name)...)
		last := len(pending) == 0
		fi, err := root.Lstat(cur)
		if errors.Is(err, fs.ErrNotExist) {
			rest := path.Join(append(append(done, name), pending...)...)
			if rest == ".." || strings.HasPrefix(rest, "../") {
				return "", errEscapes
			}
			return rest, nil
		}
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink != 0 && (!last || followLast) {
			if links++; links > maxSymlinks {
				return "", syscall.ELOOP
			}
			target, err := root.Readlink(cur)
			if err != nil {
				return "", err
			}
			if path.IsAbs(target) {
				mapped, ok := "", false
				if mapAbs != nil {
					mapped, ok = mapAbs(path.Clean(target))
				}
				if !ok {
					return "", errEscapes
				}
				done = nil
				target = mapped
			}
			pending = append(splitPath(target), pending...)
			continue
		}
		if !last && !fi.IsDir() {
			return "", syscall.ENOTDIR
		}
		done = append(done, name)
	}
	if len(done) == 0 {
		return ".", nil
	}
	return path.Join(done...), nil
}

func splitPath(p string) []string {
	var out []string
	for _, part := range strings.Split(p, "/") {
		if part != "" {
			out = append(out, part)
		}
	}
	return out
}

// mapWorkspace maps an absolute symlink target under the workspace (its sandbox path or
// the server's real path) into the workspace root.
func (s *Server) mapWorkspace(target string) (string, bool) {
	if rel, ok := underDir(target, proto.Workspace); ok {
		return rel, true
	}
	return underDir(target, s.ws)
}

// resolve is resolveIn for the workspace, with its errors as protocol errors.
func (s *Server) resolve(root *os.Root, rel string, followLast bool) (string, *proto.Error) {
	r, err := resolveIn(root, rel, followLast, s.mapWorkspace)
	if err != nil {
		return "", fsError(err)
	}
	return r, nil
}
