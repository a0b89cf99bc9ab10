package server

import (
	"errors"
	"io/fs"
	"os"
	"path"

	"golang.org/x/sys/unix"

	"sandboxd/guest/proto"
)

// dirCache holds the folders an extraction created or entered, each opened once as an
// os.Root of its own: a descriptor that never lets an operation escape it, so writing through
// it is as safe as through the staging root, and costs one step instead of a walk.
type dirCache struct {
	root  *os.Root
	roots map[string]*os.Root
}

func newDirCache(root *os.Root) *dirCache {
	return &dirCache{root: root, roots: map[string]*os.Root{}}
}

func (c *dirCache) close() {
	for _, r := range c.roots {
		r.Close()
	}
}

// dir returns the folder name (relative to the staging root, "." for it), creating it and its
// parents as needed. An existing non-folder there is an error (as MkdirAll's).
func (c *dirCache) dir(name string) (*os.Root, error) {
	if name == "." {
		return c.root, nil
	}
	if r, ok := c.roots[name]; ok {
		return r, nil
	}
	parent, err := c.dir(path.Dir(name))
	if err != nil {
		return nil, err
	}
	base := path.Base(name)
	if err := parent.Mkdir(base, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	r, err := parent.OpenRoot(base)
	if err != nil {
		// os.Root answers a file where a folder should be with an error that is no errno
		// ("not a directory"): make it ENOTDIR, a client's mistake, not an internal error.
		if fi, lerr := parent.Lstat(base); lerr == nil && !fi.IsDir() {
			err = &fs.PathError{Op: "open", Path: name, Err: unix.ENOTDIR}
		}
		return nil, err
	}
	c.roots[name] = r
	return r, nil
}

// prepare creates the parents of name and removes whatever non-directory is already there (a
// later tar entry replaces an earlier one; it is never written through a symlink). It returns
// name's folder.
func (c *dirCache) prepare(name string) (*os.Root, *proto.Error) {
	parent, err := c.dir(path.Dir(name))
	if err != nil {
		return nil, entryError(name, err)
	}
	base := path.Base(name)
	fi, err := parent.Lstat(base)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return parent, nil
	case err != nil:
		return nil, entryError(name, err)
	case fi.IsDir():
		return nil, errorf(proto.ErrCodeInvalid, "tar entry %q replaces a directory", name)
	}
	if err := parent.Remove(base); err != nil {
		return nil, entryError(name, err)
	}
	return parent, nil
}

// install moves the staged entries into the workspace.
func install(root *os.Root, staging string, replace bool) error {
	if replace {
		old, err := readDirNames(root, ".")
		if err != nil {
			return err
		}
		for _, name := range old {
			if name == staging {
				continue
			}
			if err := root.RemoveAll(name); err != nil {
				return err
			}
		}
	}
	return merge(root, staging, ".")
}

// merge moves every entry of src into dst; directories present on both sides are merged,
// anything else in dst is replaced.
func merge(root *os.Root, src, dst string) error {
	names, err := readDirNames(root, src)
	if err != nil {
		return err
	}
	for _, name := range names {
		from, to := path.Join(src, name), path.Join(dst, name)
		have, err := root.Lstat(to)
		if err == nil {
			want, err := root.Lstat(from)
			if err != nil {
				return err
			}
			if have.IsDir() && want.IsDir() {
				if err := merge(root, from, to); err != nil {
					return err
				}
				_ = root.Chmod(to, want.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
				_ = root.Chtimes(to, want.ModTime(), want.ModTime())
				continue
			}
			if err := root.RemoveAll(to); err != nil {
				return err
			}
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := root.Rename(from, to); err != nil {
			return err
		}
	}
	return nil
}

func readDirNames(root *os.Root, dir string) ([]string, error) {
	f, err := root.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

// removeStaleImports deletes staging folders left by an import that was cut short: only names
// of exactly the form the server makes (a command's .sbx-import-notes is kept).
func (s *Server) removeStaleImports() {
	root, err := os.OpenRoot(s.ws)
	if err != nil {
		return
	}
	defer root.Close()
	names, err := readDirNames(root, ".")
	if err != nil {
		return
	}
	for _, name := range names {
		if isOwnName(name, importPrefix) {
			_ = root.RemoveAll(name)
		}
	}
}
