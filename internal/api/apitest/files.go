package apitest

import (
	"context"
	"strings"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// Paths the fake's file operations answer in their own way; any other path succeeds.
const (
	// PathMissing is NOT_FOUND for StatFile, MoveFile (as from) and DeleteFile.
	PathMissing = "missing"
	// PathLink is a symlink to /etc for StatFile.
	PathLink = "link"
	// PathExisting is a directory that exists: MakeDir answers created false, MoveFile
	// ALREADY_EXISTS (as to) unless overwrite.
	PathExisting = "existing"
	// PathFull is a directory that is not empty: DeleteFile without recursive answers
	// DIRECTORY_NOT_EMPTY.
	PathFull = "full"
	// PathOutside leads out of the workspace: every file operation answers INVALID_ARGUMENT.
	PathOutside = "out/x"
)

// Cursors WatchFiles knows besides those of FileEvents.
const (
	// WatchCursorExpired names a watch that is gone: CURSOR_EXPIRED.
	WatchCursorExpired = "w00000000000000ff.3"
)

// FileEventFixtures are the events New gives FileEvents: a file created, modified, moved and
// deleted under src/, and an overflow.
func FileEventFixtures() []sandbox.FileEvent {
	c := func(n string) string { return "w0123456789abcdef." + n }
	return []sandbox.FileEvent{
		{Cursor: c("1"), Kind: sandbox.FileCreated, Path: "src/a.txt", At: T0},
		{Cursor: c("2"), Kind: sandbox.FileModified, Path: "src/a.txt", At: T0},
		{Cursor: c("3"), Kind: sandbox.FileMoved, Path: "src/b.txt", From: "src/a.txt", At: T0},
		{Cursor: c("4"), Kind: sandbox.FileCreated, Path: "src/dir", IsDir: true, At: T0},
		{Cursor: c("9"), Kind: sandbox.FileOverflow, Reason: sandbox.OverflowRing, Missed: 4, At: T0},
		{Cursor: c("10"), Kind: sandbox.FileDeleted, Path: "src/b.txt", At: T0},
	}
}

func fileOpPath(path string) error {
	switch path {
	case PathMissing:
		return apierror.New(apierror.NotFound, "/workspace/%s: no such file or directory", path)
	case PathOutside:
		return apierror.New(apierror.InvalidArgument, "path escapes the workspace")
	}
	return nil
}

// StatFile answers a symlink for PathLink, a file otherwise.
func (f *Fake) StatFile(_ context.Context, p auth.Principal, id, path string) (sandbox.FileInfo, error) {
	f.record(Call{Method: "StatFile", Principal: p, SandboxID: id, Path: path})
	if _, err := lookup(p, id); err != nil {
		return sandbox.FileInfo{}, err
	}
	if err := fileOpPath(path); err != nil {
		return sandbox.FileInfo{}, err
	}
	if path == PathLink {
		return sandbox.FileInfo{Name: "link", Path: "/workspace/link", Size: 4, Mode: 0o777, Symlink: "/etc",
			Type: sandbox.FileSymlink, ModTime: T0}, nil
	}
	return sandbox.FileInfo{Name: path[strings.LastIndex(path, "/")+1:], Path: "/workspace/" + path, Size: 5, Mode: 0o644,
		Type: sandbox.FileRegular, ModTime: T0}, nil
}

// MakeDir answers created false for PathExisting.
func (f *Fake) MakeDir(_ context.Context, p auth.Principal, id, path string) (sandbox.FileInfo, bool, error) {
	f.record(Call{Method: "MakeDir", Principal: p, SandboxID: id, Path: path})
	if _, err := lookup(p, id); err != nil {
		return sandbox.FileInfo{}, false, err
	}
	if err := fileOpPath(path); err != nil {
		return sandbox.FileInfo{}, false, err
	}
	return sandbox.FileInfo{Name: path[strings.LastIndex(path, "/")+1:], Path: "/workspace/" + path, Mode: 0o755, IsDir: true,
		Type: sandbox.FileDirectory, ModTime: T0}, path != PathExisting, nil
}

// MoveFile answers ALREADY_EXISTS onto PathExisting without overwrite.
func (f *Fake) MoveFile(_ context.Context, p auth.Principal, id, from, to string, overwrite bool) (sandbox.FileInfo, error) {
	f.record(Call{Method: "MoveFile", Principal: p, SandboxID: id, Path: from, Target: to, Overwrite: overwrite})
	if _, err := lookup(p, id); err != nil {
		return sandbox.FileInfo{}, err
	}
	for _, path := range []string{from, to} {
		if err := fileOpPath(path); err != nil {
			return sandbox.FileInfo{}, err
		}
	}
	if to == PathExisting && !overwrite {
		return sandbox.FileInfo{}, apierror.New(apierror.AlreadyExists, "/workspace/%s exists (pass overwrite to replace it)", to)
	}
	return sandbox.FileInfo{Name: to[strings.LastIndex(to, "/")+1:], Path: "/workspace/" + to, Size: 5, Mode: 0o644,
		Type: sandbox.FileRegular, ModTime: T0}, nil
}

// DeleteFile answers DIRECTORY_NOT_EMPTY for PathFull without recursive.
func (f *Fake) DeleteFile(_ context.Context, p auth.Principal, id, path string, recursive bool) error {
	f.record(Call{Method: "DeleteFile", Principal: p, SandboxID: id, Path: path, Recursive: recursive})
	if _, err := lookup(p, id); err != nil {
		return err
	}
	if err := fileOpPath(path); err != nil {
		return err
	}
	if path == PathFull && !recursive {
		return apierror.New(apierror.DirectoryNotEmpty, "/workspace/%s is a directory that is not empty", path)
	}
	return nil
}

// WatchFiles sends the FileEvents after req.After (all of them without one): BadCursor is
// INVALID_ARGUMENT, WatchCursorExpired CURSOR_EXPIRED, a cursor FileEvents does not hold
// CURSOR_EXPIRED too.
func (f *Fake) WatchFiles(ctx context.Context, p auth.Principal, id string, req sandbox.WatchRequest) (<-chan sandbox.FileEvent, error) {
	f.record(Call{Method: "WatchFiles", Principal: p, SandboxID: id, Path: req.Path, Watch: req})
	if _, err := lookup(p, id); err != nil {
		return nil, err
	}
	if err := fileOpPath(req.Path); err != nil {
		return nil, err
	}
	f.mu.Lock()
	evs, end := append([]sandbox.FileEvent(nil), f.FileEvents...), f.FileEventsEnd
	f.mu.Unlock()
	switch {
	case req.After == BadCursor:
		return nil, apierror.New(apierror.InvalidArgument, "malformed cursor %q", req.After).WithDetail("field", "after")
	case req.After != "":
		i := 0
		for i < len(evs) && evs[i].Cursor != req.After {
			i++
		}
		if i == len(evs) {
			return nil, apierror.New(apierror.CursorExpired, "no watch for cursor %s", req.After)
		}
		evs = evs[i+1:]
	}
	out := make(chan sandbox.FileEvent)
	f.streams.Add(1)
	go func() {
		defer f.streams.Done()
		defer close(out)
		for _, e := range evs {
			select {
			case out <- e:
			case <-ctx.Done():
				return
			}
		}
		if !end {
			<-ctx.Done()
		}
	}()
	return out, nil
}
