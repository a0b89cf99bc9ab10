// Package client is the control plane's end of the guest init's protocol (guest/proto): over a
// driver's Attach stream it checks the ready byte and proves the box's channel key
// (AwaitReady, HostHandshake), then speaks HTTP/2 to PID 1 (Dial): execs and their output
// logs, files, the workspace as tar.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/net/http2"

	"sandboxd/guest/proto"
)

// ErrClosed is wrapped by every error that happened because the attach stream broke or the
// client was closed. A caller reattaches (Dial a new stream) and resumes from its offsets.
var ErrClosed = errors.New("guest: attach stream closed")

// ErrNoAnswer is wrapped by the error of a start (StartLog, Run) the init did not answer
// within startAnswerTimeout. The command may still start: the init got the request and keeps
// it. The error also wraps a *proto.Error of code ErrCodeUnavailable that says so.
var ErrNoAnswer = errors.New("guest: no answer to a start")

// startAnswerTimeout bounds a start's wait for the init's answer. The init answers once the
// command's process exists, or with its failure; its own bound on that is the spawner's 10 s.
// A box that answers nothing for this long is stuck (stopped, starved), and a caller must not
// wait on it forever: the start fails and the stream it went on is closed.
var startAnswerTimeout = 30 * time.Second

// noAnswer is the error of a start of exec id that got no answer.
func noAnswer(id string) error {
	return fmt.Errorf("%w: %w", ErrNoAnswer, &proto.Error{Code: proto.ErrCodeUnavailable,
		Message: fmt.Sprintf("the sandbox did not answer the start of exec %s within %s; the command may still start", id, startAnswerTimeout)})
}

// dialTimeout bounds Dial's health call: `init connect` itself retries for up to 10 s while
// PID 1 is not listening yet.
const dialTimeout = 15 * time.Second

// Client is the control plane's end of one attach stream. It is safe for concurrent use; all
// calls share the stream.
type Client struct {
	conn *streamConn
	cc   *http2.ClientConn
	// execStreams: Dial's health call said that the init serves exec streams.
	execStreams bool
	// streams, when set (UseExecStreams), carries StartLog's calls.
	streams *streamPool
}

// Dial speaks the protocol over rwc (a driver's Attach stream) and checks the other end with
// a health call. The client owns rwc from here on: Close closes it, and so does a failed Dial.
func Dial(rwc io.ReadWriteCloser) (*Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	return DialContext(ctx, rwc)
}

// DialContext is Dial with the caller's deadline for the health call.
func DialContext(ctx context.Context, rwc io.ReadWriteCloser) (*Client, error) {
	c, err := DialUnchecked(ctx, rwc)
	if err != nil {
		return nil, err
	}
	h, err := c.Health(ctx)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	c.execStreams = h.ExecStreams
	return c, nil
}

// DialUnchecked is DialContext without the health call, one round trip less: for a stream whose
// handshake just proved it to be the box's init and whose caller needs nothing of the health
// answer (the driver's quiesce of a pause; internal/sandbox on a driver that does not attach
// locally, where the answer's exec streams are never used). Its first call then tells whether
// the init is there.
func DialUnchecked(ctx context.Context, rwc io.ReadWriteCloser) (*Client, error) {
	conn := newStreamConn(rwc)
	// The HTTP/2 preface is written synchronously; an unresponsive stream must not hang us.
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	t := &http2.Transport{
		AllowHTTP:        true,
		MaxReadFrameSize: 256 << 10,
		ReadIdleTimeout:  30 * time.Second,
		PingTimeout:      15 * time.Second,
	}
	cc, err := t.NewClientConn(conn)
	if err != nil {
		_ = conn.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: dial: %w", ErrClosed, ctx.Err())
		}
		return nil, fmt.Errorf("%w: dial: %v", ErrClosed, err)
	}
	return &Client{conn: conn, cc: cc}, nil
}

// Close ends the stream; calls in flight fail with ErrClosed. Running execs are not affected.
func (c *Client) Close() error {
	if c.streams != nil {
		c.streams.close()
	}
	_ = c.cc.Close()
	return c.conn.Close()
}

// Done is closed when the stream broke or the client was closed.
func (c *Client) Done() <-chan struct{} {
	return c.conn.done
}

// Health asks the guest init how it is.
func (c *Client) Health(ctx context.Context) (proto.Health, error) {
	var h proto.Health
	err := c.doJSON(ctx, http.MethodGet, "/v1/health", nil, nil, &h)
	return h, err
}

// Quiesce asks the guest init to close its host socket before the box is saved for a pause
// (proto/pause.go). This stream stays usable.
func (c *Client) Quiesce(ctx context.Context) (proto.QuiesceResult, error) {
	var res proto.QuiesceResult
	err := c.doJSON(ctx, http.MethodPost, proto.QuiescePath, nil, nil, &res)
	return res, err
}

// SetEnv lays env (KEY=VALUE entries) over the base environment of every exec the guest init
// starts from now on (proto/env.go): a claimed warm box's creator's environment.
func (c *Client) SetEnv(ctx context.Context, env []string) (proto.EnvResult, error) {
	var res proto.EnvResult
	err := c.doJSON(ctx, http.MethodPut, proto.EnvPath, nil, proto.EnvRequest{Env: env}, &res)
	return res, err
}

// Release forgets the ended execs of ids that left nothing running (proto/release.go): their
// whole output and exit are kept elsewhere. An init older than the endpoint answers not found.
func (c *Client) Release(ctx context.Context, ids []string) (proto.ReleaseResult, error) {
	var res proto.ReleaseResult
	err := c.doJSON(ctx, http.MethodPost, proto.ReleasePath, nil, proto.ReleaseRequest{IDs: ids}, &res)
	return res, err
}

// StartExec starts a command. One that cannot start is not an error: it ends at once with
// exit code 127 or 126 and ExitStatus.Error.
func (c *Client) StartExec(ctx context.Context, req proto.ExecRequest) (proto.ExecInfo, error) {
	var info proto.ExecInfo
	err := c.doJSON(withExecID(ctx, req.ID), http.MethodPost, "/v1/execs", nil, req, &info)
	return info, err
}

// Exec returns one exec's state.
func (c *Client) Exec(ctx context.Context, id string) (proto.ExecInfo, error) {
	var info proto.ExecInfo
	err := c.doJSON(ctx, http.MethodGet, "/v1/execs/"+url.PathEscape(id), nil, nil, &info)
	return info, err
}

// Execs lists the execs the guest init knows (running and recently ended), oldest first.
func (c *Client) Execs(ctx context.Context) ([]proto.ExecInfo, error) {
	var infos []proto.ExecInfo
	err := c.doJSON(ctx, http.MethodGet, "/v1/execs", nil, nil, &infos)
	return infos, err
}

// Forget drops an ended exec from the guest init as if it never ran: what it left running is
// killed, its record, log and cgroup go (ErrCodeState while it runs, ErrCodeNotFound for an
// exec the init does not know).
func (c *Client) Forget(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodDelete, "/v1/execs/"+url.PathEscape(id), nil, nil, nil)
}

// Signal sends a signal ("SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", …) to an exec's whole
// process tree.
func (c *Client) Signal(ctx context.Context, id, sig string) error {
	return c.doJSON(ctx, http.MethodPost, "/v1/execs/"+url.PathEscape(id)+"/signal", nil, proto.SignalRequest{Signal: sig}, nil)
}

// WriteStdin writes data to the stdin of an exec started with StdinOpen or Tty, and closes it
// after them when closeAfter is set. The guest takes all of data or nothing: a write larger
// than proto.MaxStdinWrite is ErrCodeTooLarge, one that does not fit the exec's stdin buffer
// ErrCodeUnavailable; an exec whose stdin is not open (any more) is ErrCodeState.
func (c *Client) WriteStdin(ctx context.Context, id string, data []byte, closeAfter bool) (proto.StdinResult, error) {
	var q url.Values
	if closeAfter {
		q = url.Values{"close": {"1"}}
	}
	resp, err := c.do(ctx, http.MethodPost, "/v1/execs/"+url.PathEscape(id)+"/stdin", q, bytes.NewReader(data))
	if err != nil {
		return proto.StdinResult{}, err
	}
	defer resp.Body.Close()
	var out proto.StdinResult
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&out); err != nil {
		return proto.StdinResult{}, c.wrapErr(ctx, err)
	}
	return out, nil
}

// Resize sets the terminal size of an exec started with Tty (the command gets SIGWINCH).
func (c *Client) Resize(ctx context.Context, id string, size proto.TtySize) (proto.ExecInfo, error) {
	var info proto.ExecInfo
	err := c.doJSON(ctx, http.MethodPost, "/v1/execs/"+url.PathEscape(id)+"/resize", nil, size, &info)
	return info, err
}

// Record is one record of an exec's output log.
type Record struct {
	// Kind is RecordStdout, RecordStderr, RecordExit or RecordTruncated.
	Kind byte
	Data []byte
	// Offset is the log offset just after this record: where to resume. For a
	// RecordTruncated it is the offset where the kept log resumes.
	Offset int64
	// Missed is, for a RecordTruncated, how many log bytes (records with their headers)
	// between the reader's offset and Offset are no longer kept.
	Missed int64
}

// ExitStatus decodes the payload of a RecordExit.
func (r Record) ExitStatus() (proto.ExitStatus, error) {
	var st proto.ExitStatus
	if r.Kind != proto.RecordExit {
		return st, fmt.Errorf("guest: record kind %d is not an exit record", r.Kind)
	}
	err := json.Unmarshal(r.Data, &st)
	return st, err
}

// LogReader reads an exec's output log record by record.
type LogReader struct {
	c    *Client
	ctx  context.Context
	body io.ReadCloser
	br   *bufio.Reader
	off  int64
	hdr  [proto.RecordHeaderLen]byte
	// stream is the exec stream the log is read from (stream.go), nil over HTTP/2: the
	// stream goes on after the exit record with the next call, so the reader ends there.
	stream *streamBody
}

// Log opens an exec's output log at offset (0, or the Offset of a record read before). With
// follow the reader yields records as they are written and ends after the exit record;
// without it, it ends at the log's current end. Next returns io.EOF at the end.
func (c *Client) Log(ctx context.Context, id string, offset int64, follow bool) (*LogReader, error) {
	q := url.Values{"offset": {strconv.FormatInt(offset, 10)}}
	if follow {
		q.Set("follow", "1")
	}
	resp, err := c.do(ctx, http.MethodGet, "/v1/execs/"+url.PathEscape(id)+"/log", q, nil)
	if err != nil {
		return nil, err
	}
	return &LogReader{c: c, ctx: ctx, body: resp.Body, br: bufio.NewReaderSize(resp.Body, 64<<10), off: offset}, nil
}

// Next returns the next record; io.EOF when the log (or, following, the exec) ended.
func (r *LogReader) Next() (Record, error) {
	if r.stream != nil && r.stream.done.Load() {
		return Record{}, io.EOF
	}
	if _, err := io.ReadFull(r.br, r.hdr[:]); err != nil {
		if err == io.EOF && r.stream == nil {
			return Record{}, io.EOF
		}
		return Record{}, r.wrapErr(err)
	}
	n := binary.BigEndian.Uint32(r.hdr[1:])
	if n > proto.MaxRecordPayload && r.hdr[0] != proto.RecordExit || n > 16<<20 ||
		r.hdr[0] == proto.RecordTruncated && n != proto.TruncatedPayloadLen {
		return Record{}, fmt.Errorf("guest: corrupt log record at offset %d (kind %d, %d bytes)", r.off, r.hdr[0], n)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(r.br, data); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Record{}, r.wrapErr(err)
	}
	if r.hdr[0] == proto.RecordTruncated {
		// Not a record of the log: it moves the reader on to where the kept log resumes.
		resume := int64(binary.BigEndian.Uint64(data))
		if resume <= r.off {
			return Record{}, fmt.Errorf("guest: corrupt truncation marker at offset %d (resumes at %d)", r.off, resume)
		}
		rec := Record{Kind: proto.RecordTruncated, Data: data, Offset: resume, Missed: resume - r.off}
		r.off = resume
		return rec, nil
	}
	r.off += proto.RecordHeaderLen + int64(n)
	if r.hdr[0] == proto.RecordExit && r.stream != nil {
		r.stream.done.Store(true)
	}
	return Record{Kind: r.hdr[0], Data: data, Offset: r.off}, nil
}

// wrapErr maps a read error of the log like the rest of the client's: ErrClosed when the
// stream under it broke.
func (r *LogReader) wrapErr(err error) error {
	if r.stream != nil {
		return streamErr(r.ctx, err)
	}
	return r.c.wrapErr(r.ctx, err)
}

// Offset is the log offset after the last record returned.
func (r *LogReader) Offset() int64 { return r.off }

// Close stops reading.
func (r *LogReader) Close() error {
	return r.body.Close()
}

// StartLog starts a command and follows its log from offset 0 in the same round trip: the
// reader yields the command's records as they are written and ends after the exit record.
// Cancelling ctx stops reading; the command keeps running.
func (c *Client) StartLog(ctx context.Context, req proto.ExecRequest) (*LogReader, error) {
	if c.streams != nil {
		if st := c.streams.take(); st != nil {
			return c.startLogStream(ctx, st, req)
		}
		// None is ready: this call goes over HTTP/2, and the next one finds a stream.
		c.streams.fill()
	}
	return c.startLogHTTP(ctx, req)
}

// startLogHTTP is StartLog over HTTP/2.
func (c *Client) startLogHTTP(ctx context.Context, req proto.ExecRequest) (*LogReader, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	// The answer's headers come once the command started (or failed to): a timer bounds the
	// wait for them, and only for them. The log after them is read as long as ctx allows.
	rctx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(startAnswerTimeout, cancel)
	resp, err := c.do(withExecID(rctx, req.ID), http.MethodPost, "/v1/execs", url.Values{"follow": {"1"}}, bytes.NewReader(b))
	if !timer.Stop() && ctx.Err() == nil {
		if err == nil {
			resp.Body.Close()
		}
		cancel()
		return nil, noAnswer(req.ID)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	body := &cancelBody{ReadCloser: resp.Body, cancel: cancel}
	return &LogReader{c: c, ctx: ctx, body: body, br: bufio.NewReaderSize(body, 64<<10)}, nil
}

// RunResult is the collected outcome of Run.
type RunResult struct {
	ID     string
	Stdout []byte
	Stderr []byte
	// StdoutTruncated and StderrTruncated say that the command wrote more than was kept: the
	// cap cut the oldest bytes, or the log no longer held them.
	StdoutTruncated bool
	StderrTruncated bool
	Exit            proto.ExitStatus
}

// Run starts a command and follows its log to the end, keeping the newest maxStdout and
// maxStderr bytes (≤ 0: no cap beyond the log's own bound). Cancelling ctx stops following
// and returns what was collected with ctx's error; the command keeps running.
func (c *Client) Run(ctx context.Context, req proto.ExecRequest, maxStdout, maxStderr int) (RunResult, error) {
	res := RunResult{ID: req.ID}
	stdout, stderr := Tail{Limit: maxStdout}, Tail{Limit: maxStderr}
	gap := false
	collected := func() {
		res.Stdout, res.Stderr = stdout.Bytes(), stderr.Bytes()
		res.StdoutTruncated, res.StderrTruncated = stdout.Cut() || gap, stderr.Cut() || gap
	}
	lr, err := c.StartLog(ctx, req)
	if err != nil {
		return res, err
	}
	defer lr.Close()
	for {
		rec, err := lr.Next()
		if err == io.EOF {
			collected()
			return res, fmt.Errorf("guest: the log of exec %s ended without an exit record", req.ID)
		}
		if err != nil {
			collected()
			return res, err
		}
		switch rec.Kind {
		case proto.RecordStdout:
			stdout.Write(rec.Data)
		case proto.RecordStderr:
			stderr.Write(rec.Data)
		case proto.RecordTruncated:
			gap = true
		case proto.RecordExit:
			res.Exit, err = rec.ExitStatus()
			collected()
			if res.Exit.StdoutBytes+res.Exit.StderrBytes > 0 {
				// Exact counts: each stream is truncated when it wrote more than was kept.
				res.StdoutTruncated = res.Exit.StdoutBytes > int64(len(res.Stdout))
				res.StderrTruncated = res.Exit.StderrBytes > int64(len(res.Stderr))
			} else if res.Exit.DroppedBytes > 0 {
				res.StdoutTruncated, res.StderrTruncated = true, true // an older init's count
			}
			return res, err
		}
	}
}

// Tail keeps the newest Limit bytes written to it (Limit ≤ 0: all of them), in at most twice
// that much memory. The zero value with a Limit set is ready to use.
type Tail struct {
	Limit int
	buf   []byte
	cut   bool
}

// Write appends p, forgetting the oldest bytes beyond the limit.
func (t *Tail) Write(p []byte) {
	if t.Limit <= 0 {
		t.buf = append(t.buf, p...)
		return
	}
	if len(p) >= t.Limit {
		t.cut = t.cut || len(t.buf) > 0 || len(p) > t.Limit
		t.buf = append(t.buf[:0], p[len(p)-t.Limit:]...)
		return
	}
	if len(t.buf)+len(p) > 2*t.Limit {
		// Compact: keep the newest Limit-len(p) bytes, so that the buffer holds Limit after p.
		keep := t.Limit - len(p)
		n := copy(t.buf, t.buf[len(t.buf)-keep:])
		t.buf = t.buf[:n]
		t.cut = true
	}
	t.buf = append(t.buf, p...)
}

// Bytes returns the newest Limit bytes written (all of them without a limit).
func (t *Tail) Bytes() []byte {
	if t.Limit > 0 && len(t.buf) > t.Limit {
		return t.buf[len(t.buf)-t.Limit:]
	}
	return t.buf
}

// Cut reports whether bytes were forgotten.
func (t *Tail) Cut() bool {
	return t.cut || t.Limit > 0 && len(t.buf) > t.Limit
}

// AppendCapped appends data to buf while buf stays within limit bytes (limit <= 0: no cap)
// and reports whether anything was cut, now or before (truncated).
func AppendCapped(buf, data []byte, limit int, truncated bool) ([]byte, bool) {
	if limit <= 0 {
		return append(buf, data...), truncated
	}
	room := limit - len(buf)
	if len(data) > room {
		return append(buf, data[:max(room, 0)]...), true
	}
	return append(buf, data...), truncated
}

// ReadFile opens a file of the workspace (a path relative to it, or absolute under
// /workspace). The caller closes the reader.
func (c *Client) ReadFile(ctx context.Context, p string) (io.ReadCloser, proto.FileInfo, error) {
	resp, err := c.do(ctx, http.MethodGet, "/v1/files", url.Values{"path": {p}}, nil)
	if err != nil {
		return nil, proto.FileInfo{}, err
	}
	h := resp.Header
	fi := proto.FileInfo{Name: path.Base(p), Path: p}
	if !path.IsAbs(p) {
		fi.Path = path.Join(proto.Workspace, p)
	}
	fi.Size, _ = strconv.ParseInt(h.Get(proto.HeaderSize), 10, 64)
	if m, err := strconv.ParseUint(h.Get(proto.HeaderMode), 8, 32); err == nil {
		fi.Mode = uint32(m)
	}
	fi.ModTime, _ = time.Parse(time.RFC3339Nano, h.Get(proto.HeaderModTime))
	return &bodyCloser{c: c, ctx: ctx, rc: resp.Body}, fi, nil
}

// WriteFile writes a file atomically (parents are created) with mode's permission bits
// (os.ModeSetuid, os.ModeSetgid and os.ModeSticky, or their Unix values 0o7000, included).
func (c *Client) WriteFile(ctx context.Context, p string, mode os.FileMode, r io.Reader) (proto.FileInfo, error) {
	q := url.Values{"path": {p}, "mode": {fmt.Sprintf("%04o", proto.UnixMode(mode)|uint32(mode&0o7000))}}
	var fi proto.FileInfo
	err := c.doJSON(ctx, http.MethodPut, "/v1/files", q, bodyArg{r}, &fi)
	return fi, err
}

// ListDir lists a directory (limit ≤ 0: the server's default of 1000; at most 10000); the
// bool is true when it holds more entries than that.
func (c *Client) ListDir(ctx context.Context, p string, limit int) ([]proto.FileInfo, bool, error) {
	q := url.Values{"path": {p}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var l proto.DirListing
	err := c.doJSON(ctx, http.MethodGet, "/v1/dirs", q, nil, &l)
	return l.Entries, l.Truncated, err
}

// ErrUnordered is what ListDirAfter answers when the guest init predates listing in name
// order (it would answer the folder's first entries again, whatever after is).
var ErrUnordered = errors.New("the sandbox's init cannot list a folder in name order (it is older than this server)")

// ListDirAfter lists the limit entries of a directory whose names sort after after ("": from
// the first) in byte order, and whether more follow; limit as ListDir's.
func (c *Client) ListDirAfter(ctx context.Context, p, after string, limit int) ([]proto.FileInfo, bool, error) {
	q := url.Values{"path": {p}, "order": {"name"}}
	if after != "" {
		q.Set("after", after)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var l proto.DirListing
	if err := c.doJSON(ctx, http.MethodGet, "/v1/dirs", q, nil, &l); err != nil {
		return nil, false, err
	}
	if !l.Ordered {
		return nil, false, ErrUnordered
	}
	return l.Entries, l.Truncated, nil
}

// Remove deletes a file or an empty directory, or a whole tree with recursive.
func (c *Client) Remove(ctx context.Context, p string, recursive bool) error {
	q := url.Values{"path": {p}}
	if recursive {
		q.Set("recursive", "1")
	}
	return c.doJSON(ctx, http.MethodDelete, "/v1/files", q, nil, nil)
}

// ExportWorkspace streams the workspace as an uncompressed tar. The guest compresses it for
// the way (zstd), and it is decompressed here with a bounded window (an init that answers
// uncompressed is read as it is). A stream that breaks midway ends in an error, never in a
// clean EOF.
func (c *Client) ExportWorkspace(ctx context.Context) (io.ReadCloser, error) {
	resp, err := c.do(ctx, http.MethodGet, "/v1/workspace/tar", url.Values{"compress": {"zstd"}}, nil)
	if err != nil {
		return nil, err
	}
	body := &bodyCloser{c: c, ctx: ctx, rc: resp.Body}
	switch enc := resp.Header.Get("Content-Encoding"); enc {
	case "":
		return body, nil
	case "zstd":
		// The init's window is 1 MiB; anything larger is refused, whatever the guest says.
		zr, err := zstd.NewReader(body, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(8<<20), zstd.WithDecoderMaxMemory(64<<20))
		if err != nil {
			body.Close()
			return nil, fmt.Errorf("guest: workspace export: %w", err)
		}
		return &zstdBody{zr: zr, body: body}, nil
	default:
		body.Close()
		return nil, fmt.Errorf("guest: workspace export in an unknown encoding %q", enc)
	}
}

// zstdBody is a compressed export's tar: the decoder over the response body.
type zstdBody struct {
	zr   *zstd.Decoder
	body io.Closer
}

func (z *zstdBody) Read(p []byte) (int, error) {
	n, err := z.zr.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("guest: workspace export: %w", err)
	}
	return n, err
}

func (z *zstdBody) Close() error {
	z.zr.Close()
	return z.body.Close()
}

// ImportOptions controls ImportWorkspace.
type ImportOptions struct {
	// Replace removes the workspace's old top-level entries before the new ones move in;
	// otherwise the tar is merged over the workspace.
	Replace bool
	// MaxBytes and MaxFiles bound the content (0: 10 GiB and 1,000,000 files).
	MaxBytes int64
	MaxFiles int64
	// AllowExternalSymlinks keeps symlinks whose target lies outside the workspace (e.g. a
	// Python venv's bin/python -> /usr/bin/python3). They are created as links, never
	// followed during the extraction. Without it such a tar is refused.
	AllowExternalSymlinks bool
}

// ImportWorkspace extracts a tar into the workspace. Nothing changes unless the whole body
// was read without error: a reader that fails midway (a hash check) leaves the old
// workspace as it was.
func (c *Client) ImportWorkspace(ctx context.Context, r io.Reader, opts ImportOptions) (proto.ImportResult, error) {
	q := url.Values{}
	if opts.Replace {
		q.Set("replace", "1")
	}
	if opts.MaxBytes > 0 {
		q.Set("max_bytes", strconv.FormatInt(opts.MaxBytes, 10))
	}
	if opts.MaxFiles > 0 {
		q.Set("max_files", strconv.FormatInt(opts.MaxFiles, 10))
	}
	if opts.AllowExternalSymlinks {
		q.Set("external_symlinks", "1")
	}
	var res proto.ImportResult
	err := c.doJSON(ctx, http.MethodPut, "/v1/workspace/tar", q, bodyArg{r}, &res)
	return res, err
}

// bodyArg marks a raw request body (anything else given to doJSON is encoded as JSON).
type bodyArg struct{ r io.Reader }

func (c *Client) doJSON(ctx context.Context, method, p string, q url.Values, in, out any) error {
	var body io.Reader
	switch v := in.(type) {
	case nil:
	case bodyArg:
		body = v.r
	default:
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	resp, err := c.do(ctx, method, p, q, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return c.wrapErr(ctx, fmt.Errorf("decoding the answer to %s %s: %w", method, p, err))
	}
	return nil
}

// do sends one request; a non-2xx answer becomes a *Error.
// Inside a trace the call is a span (trace.go) that ends with the answer's body.
func (c *Client) do(ctx context.Context, method, p string, q url.Values, body io.Reader) (*http.Response, error) {
	ctx, span := startCall(ctx, method, p)
	u := url.URL{Scheme: "http", Host: "sandbox-init", Path: p, RawQuery: q.Encode()}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		endCall(span, err)
		return nil, err
	}
	resp, err := c.cc.RoundTrip(req)
	if err != nil {
		err = c.wrapErr(ctx, err)
		endCall(span, err)
		return nil, err
	}
	span.SetAttributes(keyStatus.Int(resp.StatusCode))
	if resp.StatusCode/100 == 2 {
		if span.IsRecording() {
			resp.Body = &spanBody{rc: resp.Body, ctx: ctx, c: c, span: span}
		}
		return resp, nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		err = c.wrapErr(ctx, err)
		endCall(span, err)
		return nil, err
	}
	e := &proto.Error{}
	if json.Unmarshal(b, e) != nil || e.Code == "" {
		e.Code = codeForStatus(resp.StatusCode)
		e.Message = strings.TrimSpace(string(b))
	}
	endCall(span, e)
	return nil, e
}

func codeForStatus(status int) string {
	switch status {
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return proto.ErrCodeNotFound
	case http.StatusBadRequest:
		return proto.ErrCodeInvalid
	case http.StatusConflict:
		return proto.ErrCodeExists // ErrCodeState comes with its body
	case http.StatusRequestEntityTooLarge:
		return proto.ErrCodeTooLarge
	case http.StatusInsufficientStorage:
		return proto.ErrCodeNoSpace
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return proto.ErrCodeUnavailable
	}
	return proto.ErrCodeInternal
}

// wrapErr marks errors caused by the broken stream with ErrClosed; context errors stay
// recognisable with errors.Is.
func (c *Client) wrapErr(ctx context.Context, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	select {
	case <-c.conn.done:
		return fmt.Errorf("%w: %w", ErrClosed, err)
	default:
	}
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return fmt.Errorf("guest: %w (%v)", ctx.Err(), err)
	}
	return fmt.Errorf("guest: %w", err)
}

// cancelBody is a response body whose Close also cancels the context its request was made on.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// bodyCloser maps a response body's errors like the rest of the client's.
type bodyCloser struct {
	c   *Client
	ctx context.Context
	rc  io.ReadCloser
}

func (b *bodyCloser) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil && err != io.EOF {
		err = b.c.wrapErr(b.ctx, err)
	}
	return n, err
}

func (b *bodyCloser) Close() error { return b.rc.Close() }

// streamConn turns an attach stream into the net.Conn HTTP/2 wants. Deadlines are no-ops;
// the first read or write error, or Close, closes done.
type streamConn struct {
	rwc       io.ReadWriteCloser
	done      chan struct{}
	doneOnce  sync.Once
	closeOnce sync.Once
	closeErr  error
}

func newStreamConn(rwc io.ReadWriteCloser) *streamConn {
	return &streamConn{rwc: rwc, done: make(chan struct{})}
}

func (c *streamConn) broken() { c.doneOnce.Do(func() { close(c.done) }) }

func (c *streamConn) Read(p []byte) (int, error) {
	n, err := c.rwc.Read(p)
	if err != nil {
		c.broken()
	}
	return n, err
}

func (c *streamConn) Write(p []byte) (int, error) {
	n, err := c.rwc.Write(p)
	if err != nil {
		c.broken()
	}
	return n, err
}

func (c *streamConn) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.rwc.Close() })
	c.broken()
	return c.closeErr
}

func (c *streamConn) LocalAddr() net.Addr                { return attachAddr{} }
func (c *streamConn) RemoteAddr() net.Addr               { return attachAddr{} }
func (c *streamConn) SetDeadline(t time.Time) error      { return nil }
func (c *streamConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *streamConn) SetWriteDeadline(t time.Time) error { return nil }

type attachAddr struct{}

func (attachAddr) Network() string { return "attach" }
func (attachAddr) String() string  { return "sandbox-init" }
