package sandbox

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
)

// ReadFile returns a file of the workspace, refusing files larger than maxBytes.
func (s *Service) ReadFile(ctx context.Context, p auth.Principal, id, path string, maxBytes int64) ([]byte, FileInfo, error) {
	r, info, err := s.OpenFile(ctx, p, id, path)
	if err != nil {
		return nil, FileInfo{}, err
	}
	defer r.Close()
	if maxBytes <= 0 || maxBytes > s.cfg.Limits.MaxFileBytes {
		maxBytes = s.cfg.Limits.MaxFileBytes
	}
	if info.Size > maxBytes {
		return nil, FileInfo{}, apierror.New(apierror.PayloadTooLarge, "%s is %d bytes, at most %d can be read here", path, info.Size, maxBytes)
	}
	data, err := io.ReadAll(io.LimitReader(r, maxBytes+1))
	if err != nil {
		return nil, FileInfo{}, s.GuestError(ctx, id, err)
	}
	if int64(len(data)) > maxBytes {
		return nil, FileInfo{}, apierror.New(apierror.PayloadTooLarge, "%s grew beyond %d bytes while being read", path, maxBytes)
	}
	return data, info, nil
}

// OpenFile streams a file of the workspace. The caller closes the reader.
func (s *Service) OpenFile(ctx context.Context, p auth.Principal, id, path string) (io.ReadCloser, FileInfo, error) {
	if err := s.cfg.Limits.checkPath(path); err != nil {
		return nil, FileInfo{}, err
	}
	g, err := s.filesGuest(ctx, p, id)
	if err != nil {
		return nil, FileInfo{}, err
	}
	r, fi, err := g.ReadFile(ctx, path)
	if err != nil {
		return nil, FileInfo{}, s.GuestError(ctx, id, err)
	}
	if fi.Size > s.cfg.Limits.MaxFileBytes {
		r.Close()
		return nil, FileInfo{}, apierror.New(apierror.PayloadTooLarge, "%s is %d bytes, at most %d", path, fi.Size, s.cfg.Limits.MaxFileBytes)
	}
	return r, fileInfo(fi), nil
}

// WriteFile writes a file into the workspace (parents created), bounded by the file limit.
func (s *Service) WriteFile(ctx context.Context, p auth.Principal, id, path string, mode os.FileMode, r io.Reader) (FileInfo, error) {
	if err := s.cfg.Limits.checkPath(path); err != nil {
		return FileInfo{}, err
	}
	if mode == 0 {
		mode = 0o644
	}
	if mode&^os.ModePerm != 0 {
		return FileInfo{}, apierror.New(apierror.InvalidArgument, "mode must be permission bits only (e.g. 0644), got %o", mode)
	}
	g, err := s.filesGuest(ctx, p, id)
	if err != nil {
		return FileInfo{}, err
	}
	lr := &limitedReader{r: r, left: s.cfg.Limits.MaxFileBytes}
	fi, err := g.WriteFile(ctx, path, mode, lr)
	if lr.over {
		return FileInfo{}, apierror.New(apierror.PayloadTooLarge, "the file is larger than %d bytes", s.cfg.Limits.MaxFileBytes)
	}
	if err != nil {
		return FileInfo{}, s.GuestError(ctx, id, err)
	}
	return fileInfo(fi), nil
}

// ListDir lists a folder of the workspace.
func (s *Service) ListDir(ctx context.Context, p auth.Principal, id, path string, limit int) ([]FileInfo, bool, error) {
	if path == "" {
		path = "."
	}
	if err := s.cfg.Limits.checkPath(path); err != nil {
		return nil, false, err
	}
	if limit <= 0 {
		limit = 1000
	}
	if limit > s.cfg.Limits.MaxListEntries {
		return nil, false, apierror.New(apierror.InvalidArgument, "limit must be at most %d, got %d", s.cfg.Limits.MaxListEntries, limit)
	}
	g, err := s.filesGuest(ctx, p, id)
	if err != nil {
		return nil, false, err
	}
	entries, truncated, err := g.ListDir(ctx, path, limit)
	if err != nil {
		return nil, false, s.GuestError(ctx, id, err)
	}
	out := make([]FileInfo, len(entries))
	for i, e := range entries {
		out[i] = fileInfo(e)
	}
	return out, truncated, nil
}

func (s *Service) filesGuest(ctx context.Context, p auth.Principal, id string) (*client.Client, error) {
	if _, err := s.Load(ctx, p, id, VerbFiles); err != nil {
		return nil, err
	}
	return s.Guest(ctx, id)
}

// checkPath checks a workspace path a caller gave.
func (l Limits) checkPath(path string) error {
	if path == "" {
		return apierror.New(apierror.InvalidArgument, "path is required").WithDetail("field", "path")
	}
	if len(path) > l.MaxPathBytes || strings.ContainsRune(path, 0) {
		return apierror.New(apierror.InvalidArgument, "path must be at most %d bytes without NUL", l.MaxPathBytes)
	}
	return nil
}

type limitedReader struct {
	r    io.Reader
	left int64
	over bool
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.left < 0 {
		l.over = true
		return 0, errors.New("file too large")
	}
	if int64(len(p)) > l.left+1 {
		p = p[:l.left+1]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	if l.left < 0 {
		l.over = true
		return 0, errors.New("file too large")
	}
	return n, err
}

func fileInfo(f proto.FileInfo) FileInfo {
	return FileInfo{Name: f.Name, Path: f.Path, Size: f.Size, Mode: f.Mode, IsDir: f.IsDir, Symlink: f.Symlink, ModTime: f.ModTime,
		Type: fileType(f.Type)}
}
