package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"sandboxd/guest/proto"
)

// Stat describes a file of the workspace without following a symlink at the path's end.
func (c *Client) Stat(ctx context.Context, p string) (proto.FileInfo, error) {
	var fi proto.FileInfo
	err := c.doJSON(ctx, http.MethodGet, "/v1/stat", url.Values{"path": {p}}, nil, &fi)
	return fi, err
}

// Mkdir makes a directory and its missing parents; an existing directory is no error
// (Created false).
func (c *Client) Mkdir(ctx context.Context, p string) (proto.MkdirResult, error) {
	var res proto.MkdirResult
	err := c.doJSON(ctx, http.MethodPost, "/v1/mkdir", url.Values{"path": {p}}, nil, &res)
	return res, err
}

// Move renames a file or directory (proto.MoveRequest) and describes it under its new name.
func (c *Client) Move(ctx context.Context, req proto.MoveRequest) (proto.FileInfo, error) {
	var fi proto.FileInfo
	err := c.doJSON(ctx, http.MethodPost, "/v1/move", nil, req, &fi)
	return fi, err
}

// Watch starts a watch of a directory (proto.WatchRequest); read it with WatchEvents.
func (c *Client) Watch(ctx context.Context, req proto.WatchRequest) (proto.WatchInfo, error) {
	var info proto.WatchInfo
	err := c.doJSON(ctx, http.MethodPost, "/v1/watches", nil, req, &info)
	return info, err
}

// DeleteWatch ends a watch at once (its readers get an EventEnd with ErrCodeGone).
func (c *Client) DeleteWatch(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodDelete, "/v1/watches/"+url.PathEscape(id), nil, nil, nil)
}

// WatchReader reads a watch's events.
type WatchReader struct {
	c     *Client
	ctx   context.Context
	body  io.ReadCloser
	sc    *bufio.Scanner
	ended bool
}

// WatchEvents follows a watch's events after sequence after. path and recursive, when path is
// not "", must be the watch's (else ErrCodeInvalid): a caller resuming from a cursor checks
// that it names a watch of what it asks for. A watch that no longer exists is ErrCodeGone.
func (c *Client) WatchEvents(ctx context.Context, id string, after uint64, path string, recursive bool) (*WatchReader, error) {
	q := url.Values{"after": {strconv.FormatUint(after, 10)}}
	if path != "" {
		q.Set("path", path)
		q.Set("recursive", strconv.FormatBool(recursive))
	}
	resp, err := c.do(ctx, http.MethodGet, "/v1/watches/"+url.PathEscape(id)+"/events", q, nil)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	return &WatchReader{c: c, ctx: ctx, body: resp.Body, sc: sc}, nil
}

// Next returns the next event: io.EOF after an EventEnd, io.ErrUnexpectedEOF when the stream
// ended without one (the watch was closed, or the guest went away).
func (r *WatchReader) Next() (proto.WatchEvent, error) {
	if r.ended {
		return proto.WatchEvent{}, io.EOF
	}
	if !r.sc.Scan() {
		if err := r.sc.Err(); err != nil {
			return proto.WatchEvent{}, r.c.wrapErr(r.ctx, err)
		}
		return proto.WatchEvent{}, io.ErrUnexpectedEOF
	}
	var ev proto.WatchEvent
	if err := json.Unmarshal(r.sc.Bytes(), &ev); err != nil {
		return proto.WatchEvent{}, fmt.Errorf("guest: decoding a watch event: %w", err)
	}
	r.ended = ev.Kind == proto.EventEnd
	return ev, nil
}

// Close stops reading (the watch lives on for its grace period).
func (r *WatchReader) Close() error { return r.body.Close() }
