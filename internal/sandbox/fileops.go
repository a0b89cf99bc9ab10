package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"sandboxd/guest/proto"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
)

// File operations besides read, write and list: stat, mkdir, move and delete. The guest init
// resolves every path the same symlink-safe way (parents through links that stay inside the
// workspace, the last component never followed) and acts on directory descriptors, so a
// symlink a command swaps in between a check and the act is never followed.

// FileType is the kind of a file.
type FileType string

// Kinds of file.
const (
	FileRegular   FileType = "FILE"
	FileDirectory FileType = "DIRECTORY"
	FileSymlink   FileType = "SYMLINK"
	FileSocket    FileType = "SOCKET"
	FileFIFO      FileType = "FIFO"
	FileCharDev   FileType = "CHAR_DEVICE"
	FileBlockDev  FileType = "BLOCK_DEVICE"
	FileOther     FileType = "OTHER"
)

// fileType converts the guest's kind of file ("" stays "": an older init).
func fileType(t string) FileType {
	switch t {
	case "":
		return ""
	case proto.FileTypeFile:
		return FileRegular
	case proto.FileTypeDir:
		return FileDirectory
	case proto.FileTypeSymlink:
		return FileSymlink
	case proto.FileTypeSocket:
		return FileSocket
	case proto.FileTypeFIFO:
		return FileFIFO
	case proto.FileTypeCharDev:
		return FileCharDev
	case proto.FileTypeBlockDev:
		return FileBlockDev
	}
	return FileOther
}

// StatFile describes a path of the workspace. A symlink is reported as one (FileSymlink, its
// target in Symlink), never followed; "." (or "/workspace") is the workspace itself.
func (s *Service) StatFile(ctx context.Context, p auth.Principal, id, path string) (FileInfo, error) {
	if err := s.cfg.Limits.checkPath(path); err != nil {
		return FileInfo{}, err
	}
	g, err := s.filesGuest(ctx, p, id)
	if err != nil {
		return FileInfo{}, err
	}
	fi, err := g.Stat(ctx, path)
	if err != nil {
		return FileInfo{}, s.fileOpError(ctx, id, err)
	}
	return fileInfo(fi), nil
}

// MakeDir makes a directory and its missing parents. An existing directory is no error
// (created is false); anything else in its place is ALREADY_EXISTS.
func (s *Service) MakeDir(ctx context.Context, p auth.Principal, id, path string) (FileInfo, bool, error) {
	if err := s.cfg.Limits.checkPath(path); err != nil {
		return FileInfo{}, false, err
	}
	g, err := s.filesGuest(ctx, p, id)
	if err != nil {
		return FileInfo{}, false, err
	}
	res, err := g.Mkdir(ctx, path)
	if err != nil {
		return FileInfo{}, false, s.fileOpError(ctx, id, err)
	}
	return fileInfo(res.FileInfo), res.Created, nil
}

// MoveFile renames from to to (the new name itself, never into a folder). An existing to is
// ALREADY_EXISTS unless overwrite; with it a file, a symlink (never followed) or an empty
// directory there is replaced, a full one is DIRECTORY_NOT_EMPTY. The workspace itself, a
// directory into itself and from == to are INVALID_ARGUMENT.
func (s *Service) MoveFile(ctx context.Context, p auth.Principal, id, from, to string, overwrite bool) (FileInfo, error) {
	for _, path := range []string{from, to} {
		if err := s.cfg.Limits.checkPath(path); err != nil {
			return FileInfo{}, err
		}
	}
	g, err := s.filesGuest(ctx, p, id)
	if err != nil {
		return FileInfo{}, err
	}
	fi, err := g.Move(ctx, proto.MoveRequest{From: from, To: to, Overwrite: overwrite})
	if err != nil {
		return FileInfo{}, s.fileOpError(ctx, id, err)
	}
	return fileInfo(fi), nil
}

// DeleteFile deletes a file, a symlink (never what it points to) or an empty directory, and
// with recursive a directory and everything below it: the guest moves the tree aside at once
// (the name is free when this returns) and removes it in the background, so a tree of a
// million entries answers as fast as one file. A directory that is not empty without
// recursive is DIRECTORY_NOT_EMPTY; the workspace itself is INVALID_ARGUMENT.
func (s *Service) DeleteFile(ctx context.Context, p auth.Principal, id, path string, recursive bool) error {
	if err := s.cfg.Limits.checkPath(path); err != nil {
		return err
	}
	g, err := s.filesGuest(ctx, p, id)
	if err != nil {
		return err
	}
	if err := g.Remove(ctx, path, recursive); err != nil {
		return s.fileOpError(ctx, id, err)
	}
	return nil
}

// fileOpError is GuestError with the codes of file operations and watches.
func (s *Service) fileOpError(ctx context.Context, id string, err error) error {
	var ge *proto.Error
	if errors.As(err, &ge) {
		switch ge.Code {
		case proto.ErrCodeNotEmpty:
			return apierror.Wrap(err, apierror.DirectoryNotEmpty, "%s", ge.Message)
		case proto.ErrCodeGone:
			return apierror.Wrap(err, apierror.CursorExpired, "%s; watch again without a cursor (and rescan)", ge.Message)
		case proto.ErrCodeTooMany:
			if strings.Contains(ge.Message, "reader") {
				return apierror.Wrap(err, apierror.LimitExceeded, "%s", ge.Message).
					WithDetail("limit_name", "readers_per_watch").WithRetryAfter(5 * time.Second)
			}
			return apierror.Wrap(err, apierror.LimitExceeded, "%s", ge.Message).
				WithDetail("limit_name", "watches_per_sandbox").WithRetryAfter(5 * time.Second)
		case proto.ErrCodeTooLarge:
			if strings.Contains(ge.Message, "directories") {
				return apierror.Wrap(err, apierror.InvalidArgument, "%s", ge.Message).WithDetail("limit_name", "watch_max_dirs")
			}
		}
	}
	return s.GuestError(ctx, id, err)
}

// checkWatch fills the watch limits' defaults and checks them against the guest's bounds.
func (l *Limits) checkWatch() error {
	d := DefaultLimits()
	for _, c := range []struct {
		name     string
		v        *int
		def, max int
	}{
		{"watch_max_per_sandbox", &l.WatchMaxPerSandbox, d.WatchMaxPerSandbox, proto.MaxWatches},
		{"watch_max_dirs", &l.WatchMaxDirs, d.WatchMaxDirs, proto.MaxWatchDirs},
		{"watch_max_events", &l.WatchMaxEvents, d.WatchMaxEvents, proto.MaxWatchEvents},
		{"watch_grace_sec", &l.WatchGraceSec, d.WatchGraceSec, int(proto.MaxWatchGrace / time.Second)},
	} {
		if *c.v == 0 {
			*c.v = c.def
		}
		if *c.v < 0 || *c.v > c.max {
			return fmt.Errorf("sandbox config: limits.%s must be 1 to %d, got %d", c.name, c.max, *c.v)
		}
	}
	return nil
}
