package sandbox

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
)

// FileListOptions asks for one page of a folder, in name order.
type FileListOptions struct {
	// Limit is the page size: 1 to Limits.MaxListEntries (0: 1000).
	Limit int
	// After is the FileCursor of the last entry of the previous page ("": the first page).
	After string
}

// FilePage is one page of a folder's entries, in byte order of their names.
type FilePage struct {
	Entries []FileInfo
	// NextCursor is the cursor of the next page, "" on the last page.
	NextCursor string
}

// fileCursorPrefix starts every file cursor (a version, so the form can change).
const fileCursorPrefix = "f1."

// maxFileCursor bounds a cursor's length: the prefix and a NAME_MAX name in base64.
var maxFileCursor = len(fileCursorPrefix) + base64.RawURLEncoding.EncodedLen(proto.MaxNameBytes)

// FileCursor is the list cursor of a folder entry: its name, opaque to clients. A page goes
// on after that name's place in the order, also when the entry was removed meanwhile.
func FileCursor(name string) string {
	return fileCursorPrefix + base64.RawURLEncoding.EncodeToString([]byte(name))
}

// parseFileCursor reads a FileCursor: one name of a folder, never a path.
func parseFileCursor(c string) (string, bool) {
	rest, ok := strings.CutPrefix(c, fileCursorPrefix)
	if !ok || len(c) > maxFileCursor {
		return "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil || !proto.ValidEntryName(string(b)) {
		return "", false
	}
	return string(b), true
}

// FilePage returns one page of a folder of a running sandbox's workspace, in byte order of
// the names: at most opts.Limit entries (default 1000, at most the list limit, else
// INVALID_ARGUMENT) after opts.After (a cursor that is not one this service handed out is
// INVALID_ARGUMENT). The guest init reads the folder and answers only the page, so a page
// costs O(page) transfer and memory whatever the folder holds.
func (s *Service) FilePage(ctx context.Context, p auth.Principal, id, path string, opts FileListOptions) (FilePage, error) {
	if path == "" {
		path = "."
	}
	if err := s.cfg.Limits.checkPath(path); err != nil {
		return FilePage{}, err
	}
	limit := opts.Limit
	if limit <= 0 {
		limit = 1000
	}
	if limit > s.cfg.Limits.MaxListEntries {
		return FilePage{}, apierror.New(apierror.InvalidArgument, "first must be at most %d, got %d", s.cfg.Limits.MaxListEntries, limit).
			WithDetail("field", "first")
	}
	var after string
	if opts.After != "" {
		var ok bool
		if after, ok = parseFileCursor(opts.After); !ok {
			return FilePage{}, apierror.New(apierror.InvalidArgument, "malformed cursor %q", apierror.Truncate(opts.After, 64)).
				WithDetail("field", "after")
		}
	}
	g, err := s.filesGuest(ctx, p, id)
	if err != nil {
		return FilePage{}, err
	}
	entries, more, err := g.ListDirAfter(ctx, path, after, limit)
	if errors.Is(err, client.ErrUnordered) {
		return FilePage{}, apierror.New(apierror.Unsupported, "this sandbox's init is older than the server and cannot page a folder in name order")
	}
	if err != nil {
		return FilePage{}, s.GuestError(ctx, id, err)
	}
	page := FilePage{Entries: make([]FileInfo, len(entries))}
	for i, e := range entries {
		page.Entries[i] = fileInfo(e)
	}
	if more && len(entries) > 0 {
		page.NextCursor = FileCursor(entries[len(entries)-1].Name)
	}
	return page, nil
}
