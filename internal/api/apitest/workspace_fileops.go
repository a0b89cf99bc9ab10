package apitest

import (
	"context"
	"path"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// StatFile and MakeDir of a Workspace work on its in-memory tree, resolved as the guest
// resolves them (a link at the path's end is reported, never followed); MoveFile, DeleteFile
// and WatchFiles stay the Fake's.

// typed is info with the node's FileType.
func (w *Workspace) typed(rel string, n Node) sandbox.FileInfo {
	fi := w.info(rel, n)
	switch {
	case n.Link != "":
		fi.Type = sandbox.FileSymlink
	case n.Dir:
		fi.Type = sandbox.FileDirectory
	case n.Special:
		fi.Type = sandbox.FileFIFO
	default:
		fi.Type = sandbox.FileRegular
	}
	return fi
}

// StatFile describes a path of the workspace, a link at its end as the link.
func (w *Workspace) StatFile(_ context.Context, p auth.Principal, id, file string) (sandbox.FileInfo, error) {
	w.record(Call{Method: "StatFile", Principal: p, SandboxID: id, Path: file})
	if _, err := lookup(p, id); err != nil {
		return sandbox.FileInfo{}, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	rel, n, ok, err := w.resolve(file, false)
	switch {
	case err != nil:
		return sandbox.FileInfo{}, err
	case !ok:
		return sandbox.FileInfo{}, apierror.New(apierror.NotFound, "%s: no such file or directory", file)
	}
	return w.typed(rel, n), nil
}

// MakeDir makes a folder and its missing parents; created is false when it was there. A
// file (or a special file) on the way is INVALID_ARGUMENT.
func (w *Workspace) MakeDir(_ context.Context, p auth.Principal, id, dir string) (sandbox.FileInfo, bool, error) {
	w.record(Call{Method: "MakeDir", Principal: p, SandboxID: id, Path: dir})
	if _, err := lookup(p, id); err != nil {
		return sandbox.FileInfo{}, false, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	rel, n, ok, err := w.resolve(dir, true)
	switch {
	case err != nil:
		return sandbox.FileInfo{}, false, err
	case ok && n.Dir:
		return w.typed(rel, n), false, nil
	case ok:
		return sandbox.FileInfo{}, false, apierror.New(apierror.InvalidArgument, "/workspace/%s exists and is not a directory", rel)
	}
	var missing []string
	for d := rel; d != "."; d = path.Dir(d) {
		pn, ok := w.nodes[d]
		if ok && !pn.Dir {
			return sandbox.FileInfo{}, false, apierror.New(apierror.InvalidArgument, "/workspace/%s is not a directory", d)
		}
		if !ok {
			missing = append(missing, d)
		}
	}
	for _, d := range missing {
		w.nodes[d] = Node{Dir: true, Mode: 0o755}
	}
	return w.typed(rel, w.nodes[rel]), true, nil
}
