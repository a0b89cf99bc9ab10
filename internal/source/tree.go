package source

import (
	"archive/tar"
	"strings"
	"time"

	"sandboxd/internal/tarsafe"
)

// entry is one entry of a source, in the source's own terms.
type entry struct {
	name   string // as in the source
	kind   byte   // a tar type flag (TypeReg, TypeDir, TypeSymlink, TypeLink, …) or tarsafe.TypeSocket
	size   int64  // of a regular file
	mode   int64  // permission bits as in the source
	target string // of a symlink or hard link
	mtime  time.Time
}

type node uint8

const (
	nodeDir node = iota + 1
	nodeFile
	nodeSymlink
)

// tree applies the rules to a source's entries in order and keeps what it needs for that:
// every path seen so far with what it is, and the paths that symlink targets resolve through.
type tree struct {
	noun      string // "archive entry" or "object", for messages
	maxFiles  int
	maxFile   int64
	maxTotal  int64
	nodes     map[string]node
	via       map[string]string // path → a symlink whose target resolves through it
	entries   int
	total     int64
	metaBytes int64
	walked    int64 // bytes of paths looked up while walking symlink targets
}

func (f *Fetcher) newTree(noun string) *tree {
	return &tree{noun: noun, maxFiles: f.opts.MaxFiles, maxFile: f.opts.MaxFileBytes,
		maxTotal: f.opts.MaxTotalBytes, nodes: map[string]node{}, via: map[string]string{}}
}

// add checks e against the rules and everything before it and returns the tar headers to
// write for it: the parent directories no earlier entry made, then e itself (nothing for an
// entry that names the root directory). label names e in errors ("" for e.name).
func (t *tree) add(e entry, label string) ([]*tar.Header, error) {
	if label == "" {
		label = e.name
	}
	bad := func(format string, args ...any) ([]*tar.Header, error) {
		return nil, invalid(t.noun, label, format, args...)
	}
	t.entries++
	if t.entries > t.maxFiles {
		return nil, tooLarge(t.noun, label, "is one entry more than the limit of %d", t.maxFiles)
	}
	if err := tarsafe.CheckType(e.kind); err != nil {
		return bad("%v", err)
	}
	name, err := tarsafe.CleanName(e.name)
	if err != nil {
		return bad("%v", err)
	}
	if name == "." {
		if e.kind == tar.TypeDir {
			return nil, nil
		}
		return bad("replaces the root directory")
	}
	if t.metaBytes += int64(len(name) + len(e.target)); t.metaBytes > maxMetaBytes {
		return nil, tooLarge(t.noun, label, "takes the names and link targets over %d bytes", maxMetaBytes)
	}
	mtime := e.mtime.Truncate(time.Second)

	// The parents. Every directory the tree knows has known directories as parents (a
	// directory is never replaced), so the walk up stops at the first known one and the work
	// is bounded by the directories it adds, which count as entries and names.
	var missing []string
	for i := len(name); ; {
		if i = strings.LastIndexByte(name[:i], '/'); i < 0 {
			break
		}
		dir := name[:i]
		k := t.nodes[dir]
		if k == nodeDir {
			break
		}
		switch k {
		case nodeSymlink:
			return bad("lies below the symlink %q", dir)
		case nodeFile:
			return bad("lies below the file %q", dir)
		}
		missing = append(missing, dir)
	}
	var hdrs []*tar.Header
	for i := len(missing) - 1; i >= 0; i-- {
		dir := missing[i]
		t.entries++
		if t.entries > t.maxFiles {
			return nil, tooLarge(t.noun, label, "takes the entries, with the directories its path implies, over the limit of %d", t.maxFiles)
		}
		if t.metaBytes += int64(len(dir)); t.metaBytes > maxMetaBytes {
			return nil, tooLarge(t.noun, label, "takes the names and link targets over %d bytes", maxMetaBytes)
		}
		t.nodes[dir] = nodeDir
		hdrs = append(hdrs, &tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755, ModTime: mtime})
	}
	prev := t.nodes[name]
	if e.kind == tar.TypeDir && prev != 0 && prev != nodeDir {
		return bad("replaces a file or symlink with a directory")
	}
	if e.kind != tar.TypeDir && prev == nodeDir {
		return bad("replaces a directory")
	}

	h := &tar.Header{Name: name, ModTime: mtime}
	switch e.kind {
	case tar.TypeDir:
		h.Typeflag, h.Name, h.Mode = tar.TypeDir, name+"/", dirMode(e.mode)
		t.nodes[name] = nodeDir
	case tar.TypeReg:
		if e.size < 0 {
			return bad("has a negative size")
		}
		if e.size > t.maxFile {
			return nil, tooLarge(t.noun, label, "is %d bytes, over the limit of %d bytes per file", e.size, t.maxFile)
		}
		if t.total+e.size > t.maxTotal {
			return nil, tooLarge(t.noun, label, "takes the content over the limit of %d bytes", t.maxTotal)
		}
		t.total += e.size
		h.Typeflag, h.Size, h.Mode = tar.TypeReg, e.size, fileMode(e.mode)
		t.nodes[name] = nodeFile
	case tar.TypeSymlink:
		if err := t.checkSymlink(name, e.target, label); err != nil {
			return nil, err
		}
		if l, ok := t.via[name]; ok {
			return bad("is a symlink in the path of the target of the symlink %q", l)
		}
		h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.target, 0o777
		t.nodes[name] = nodeSymlink
	case tar.TypeLink:
		target, err := tarsafe.CleanName(e.target)
		if err != nil || target == "." {
			return bad("is a hard link to %q, outside the root", e.target)
		}
		if t.nodes[target] != nodeFile || target == name {
			return bad("is a hard link to %q, which is not an earlier regular file", e.target)
		}
		h.Typeflag, h.Linkname = tar.TypeLink, target
		t.nodes[name] = nodeFile
	}
	return append(hdrs, h), nil
}

// checkSymlink checks the target of a symlink at name (a clean path): relative, and resolving
// inside the root. The target is walked component by component from the link's directory
// (whose parents are all real directories: no entry may lie below a symlink); a component
// that the walk goes through (one with components after it) must not be a symlink of the
// source, and the paths it goes through are remembered so that no later symlink can take
// their place. So the target resolves inside the root whatever order the entries come in.
func (t *tree) checkSymlink(name, target, label string) error {
	bad := func(format string, args ...any) error { return invalid(t.noun, label, format, args...) }
	switch {
	case target == "":
		return bad("is a symlink without a target")
	case strings.IndexByte(target, 0) >= 0:
		return bad("is a symlink whose target holds a NUL byte")
	case len(target) > tarsafe.MaxPathBytes:
		return bad("is a symlink whose target is longer than 4096 bytes")
	case strings.HasPrefix(target, "/"):
		return bad("is a symlink to the absolute path %q", target)
	}
	// p is the path walked so far; marks[i] is its length before its i-th component.
	p := make([]byte, 0, len(name)+len(target)+1)
	var marks []int
	push := func(c string) {
		marks = append(marks, len(p))
		if len(p) > 0 {
			p = append(p, '/')
		}
		p = append(p, c...)
	}
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		for c := range strings.SplitSeq(name[:i], "/") {
			push(c)
		}
	}
	comps := strings.Split(target, "/")
	for i, c := range comps {
		switch c {
		case "", ".":
			continue
		case "..":
			if len(marks) == 0 {
				return bad("is a symlink to %q, outside the root", target)
			}
			p, marks = p[:marks[len(marks)-1]], marks[:len(marks)-1]
			continue
		}
		push(c)
		if i == len(comps)-1 {
			continue // the final component may be a symlink: it is checked on its own
		}
		// Lookups with string(p) do not allocate; the work (hashing p) is bounded overall.
		if t.walked += int64(len(p)); t.walked > maxWalkBytes {
			return tooLarge(t.noun, label, "takes the symlink targets' paths over %d bytes", maxWalkBytes)
		}
		if t.nodes[string(p)] == nodeSymlink {
			return bad("is a symlink to %q, which goes through the symlink %q", target, p)
		}
		if _, ok := t.via[string(p)]; !ok {
			t.via[string(p)] = name
			if t.metaBytes += int64(len(p)); t.metaBytes > maxMetaBytes {
				return tooLarge(t.noun, label, "takes the names and link targets over %d bytes", maxMetaBytes)
			}
		}
	}
	return nil
}

// fileMode: the permission bits without setuid, setgid, sticky and group/other write; the
// owner may always read and write. No bits at all (some zip tools) means 0644.
func fileMode(m int64) int64 {
	p := m & 0o777
	if p == 0 {
		return 0o644
	}
	return p&0o755 | 0o600
}

// dirMode: as fileMode, and the owner may always list and enter. No bits means 0755.
func dirMode(m int64) int64 {
	p := m & 0o777
	if p == 0 {
		return 0o755
	}
	return p&0o755 | 0o700
}
