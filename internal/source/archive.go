package source

import (
	"archive/tar"
	"archive/zip"
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"sandboxd/internal/apierror"
	"sandboxd/internal/tarsafe"
)

const nounEntry = "archive entry"

// Archive fetches the archive at rawURL (zip, tar, tar.gz or tar.zst, told apart by their
// first bytes, never by the URL) and returns its content as a normalized tar stream.
//
// Everything that can be refused before the content flows is refused here: the URL (https
// only, unless its host is allow-listed; no loopback, private, link-local, CGNAT,
// multicast or other non-public address, checked before connecting, at every one of at most
// five redirects and on the address actually connected to), the HTTP status, the format, and
// for a zip (spooled to a temporary file, bounded by MaxDownloadBytes) every entry. A tar
// archive is checked and re-emitted entry by entry while it downloads: a refusal in the middle
// ends the stream with that error, so the consumer's staged import fails and is discarded.
//
// The caller reads the stream and closes it; Close stops the download. The stream's goroutine
// ends with the stream (read to its end or failed) or with Close, whichever comes first.
func (f *Fetcher) Archive(ctx context.Context, rawURL string) (io.ReadCloser, error) {
	u, err := f.parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	j := f.newJob(ctx, u.Host)
	started := false
	defer func() {
		if !started {
			j.release()
		}
	}()
	if err := f.checkURL(j.ictx, u); err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(j.ictx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, apierror.New(apierror.InvalidArgument, "archive URL is not a valid request URL")
	}
	req.Header.Set("User-Agent", "sandboxd-source/1")
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, f.netError(j.ictx, u.Hostname(), err)
	}
	j.closers = append(j.closers, func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		return nil, f.statusError(resp.Request.URL, resp)
	}
	if resp.ContentLength > f.opts.MaxDownloadBytes {
		return nil, tooLarge("", "", "the archive is %d bytes, over the limit of %d bytes", resp.ContentLength, f.opts.MaxDownloadBytes)
	}
	j.body = &download{r: resp.Body, max: f.opts.MaxDownloadBytes, onRead: j.resetStall}
	j.startStall()

	br := bufio.NewReaderSize(j.body, 64<<10)
	head, err := br.Peek(512)
	if err != nil && err != io.EOF {
		return nil, j.fail(err, "", false)
	}
	format := sniff(head)
	var dec io.Reader
	switch format {
	case "zip":
		rc, err := j.fromZip(br)
		if err == nil {
			started = true
		}
		return rc, err
	case "gzip":
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, j.fail(err, "", false)
		}
		j.closers = append(j.closers, func() { gz.Close() })
		dec = gz
	case "zstd":
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxZstdWindow))
		if err != nil {
			return nil, fmt.Errorf("source: zstd reader: %w", err)
		}
		j.closers = append(j.closers, zr.Close)
		dec = zr
	case "tar":
		dec = br
	default:
		return nil, invalid("", "", "the archive at %s is %s", hostOf(u), format)
	}
	j.xr = &expander{r: dec, max: f.expandLimit()}
	if format != "tar" && f.opts.MaxRatio > 0 {
		j.xr.ratio, j.xr.src = f.opts.MaxRatio, j.body
	}
	tr := bufio.NewReaderSize(j.xr, 64<<10)
	inner, err := tr.Peek(512)
	if err != nil && err != io.EOF {
		return nil, j.fail(err, "", false)
	}
	if format != "tar" && !isTar(inner) {
		return nil, invalid("", "", "the %s stream at %s does not hold a tar archive", format, hostOf(u))
	}
	started = true
	return j.start(func(tw *tar.Writer) error { return j.fromTar(tr, tw) }), nil
}

// expandLimit bounds the bytes a tar stream may expand to: the content limit plus room for
// every entry's headers and padding.
func (f *Fetcher) expandLimit() int64 {
	return f.opts.MaxTotalBytes + int64(f.opts.MaxFiles+2)*4096 + 2*maxMetaBytes + 1<<20
}

// sniff names the format of an archive by its first bytes: "zip", "gzip", "zstd", "tar", or
// a description of what it is instead.
func sniff(b []byte) string {
	switch {
	case bytes.HasPrefix(b, []byte("PK\x03\x04")), bytes.HasPrefix(b, []byte("PK\x05\x06")):
		return "zip"
	case bytes.HasPrefix(b, []byte{0x1f, 0x8b}):
		return "gzip"
	case bytes.HasPrefix(b, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return "zstd"
	case isTar(b):
		return "tar"
	case len(b) == 0:
		return "empty"
	case bytes.HasPrefix(b, []byte("BZh")):
		return "a bzip2 stream, which is not supported (zip, tar, tar.gz and tar.zst are)"
	case bytes.HasPrefix(b, []byte("\xfd7zXZ\x00")):
		return "an xz stream, which is not supported (zip, tar, tar.gz and tar.zst are)"
	case bytes.HasPrefix(b, []byte("7z\xbc\xaf\x27\x1c")):
		return "a 7z archive, which is not supported (zip, tar, tar.gz and tar.zst are)"
	case bytes.HasPrefix(b, []byte("Rar!")):
		return "a rar archive, which is not supported (zip, tar, tar.gz and tar.zst are)"
	}
	return "not a zip, tar, tar.gz or tar.zst archive"
}

// isTar reports whether b starts with a tar header: the ustar magic at offset 257 (POSIX and
// GNU tar), a pre-POSIX header with a valid checksum, or a zero block (an empty archive).
func isTar(b []byte) bool {
	if len(b) < 512 {
		return false
	}
	b = b[:512]
	if string(b[257:262]) == "ustar" {
		return true
	}
	if bytes.Count(b, []byte{0}) == 512 {
		return true
	}
	// Pre-POSIX: the checksum (octal, at 148) is the sum of the header's bytes with the
	// checksum field taken as spaces.
	field := strings.TrimRight(strings.TrimLeft(string(b[148:156]), " "), " \x00")
	want, err := strconv.ParseInt(field, 8, 64)
	if err != nil || b[0] == 0 {
		return false
	}
	var sum int64
	for i, c := range b {
		if i >= 148 && i < 156 {
			c = ' '
		}
		sum += int64(c)
	}
	return sum == want
}

// fromTar checks and re-emits the entries of a tar stream.
func (j *job) fromTar(r io.Reader, tw *tar.Writer) error {
	t := j.f.newTree(nounEntry)
	tr := tar.NewReader(r)
	buf := make([]byte, 128<<10)
	last := ""
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil && (hdr == nil || !errors.Is(err, tar.ErrInsecurePath)) {
			return j.fail(err, last, true)
		}
		kind := hdr.Typeflag
		switch kind {
		case tar.TypeXGlobalHeader:
			continue // applies to later entries; tar.Reader has taken what matters
		case '\x00': // pre-POSIX regular file (or directory, by its trailing slash)
			kind = tar.TypeReg
			if strings.HasSuffix(hdr.Name, "/") {
				kind = tar.TypeDir
			}
		case tar.TypeGNUSparse: // tar.Reader expands the holes
			kind = tar.TypeReg
		}
		e := entry{name: hdr.Name, kind: kind, size: hdr.Size, mode: hdr.Mode,
			target: hdr.Linkname, mtime: hdr.ModTime}
		if kind != tar.TypeReg {
			e.size = 0
		}
		hdrs, err := t.add(e, "")
		if err != nil {
			return err
		}
		for _, h := range hdrs {
			if err := tw.WriteHeader(h); err != nil {
				return j.fail(err, hdr.Name, false)
			}
		}
		if e.size > 0 {
			n, err := io.CopyBuffer(tw, tr, buf)
			if err == nil && n != e.size {
				err = io.ErrUnexpectedEOF
			}
			if err != nil {
				return j.fail(err, hdr.Name, false)
			}
		}
		last = hdr.Name
	}
}

// zipItem is an entry of a zip archive, checked: the headers to write and, for a regular file
// with content, the file to copy.
type zipItem struct {
	hdrs []*tar.Header
	file *zip.File
	size int64
}

// fromZip spools a zip archive to an unlinked temporary file, checks its directory and every
// entry, and returns the stream that re-emits them.
func (j *job) fromZip(r io.Reader) (io.ReadCloser, error) {
	tmp, err := os.CreateTemp(j.f.opts.TempDir, "sandboxd-source-*.zip")
	if err != nil {
		return nil, fmt.Errorf("source: spooling a zip archive: %w", err)
	}
	_ = os.Remove(tmp.Name()) // the open descriptor keeps it; a crash leaves nothing behind
	j.closers = append(j.closers, func() { tmp.Close() })
	size, err := io.Copy(tmp, r)
	if err != nil {
		if j.body.over || j.body.err != nil || j.ictx.Err() != nil {
			return nil, j.fail(err, "", false)
		}
		return nil, fmt.Errorf("source: spooling a zip archive: %w", err)
	}
	j.stopStall()

	lim := j.f.opts
	if count, dirSize, ok := zipDirectory(tmp, size); ok {
		if count > uint64(lim.MaxFiles) {
			return nil, tooLarge("", "", "the zip archive holds %d entries, over the limit of %d", count, lim.MaxFiles)
		}
		if dirSize > 2*maxMetaBytes {
			return nil, tooLarge("", "", "the zip archive's directory is %d bytes, over the limit of %d", dirSize, 2*maxMetaBytes)
		}
	}
	zr, err := zip.NewReader(tmp, size)
	if err != nil && (zr == nil || !errors.Is(err, zip.ErrInsecurePath)) {
		return nil, apierror.Wrap(err, apierror.InvalidArgument, "the zip archive is malformed: %v", err)
	}
	zr.RegisterDecompressor(zip.Deflate, func(r io.Reader) io.ReadCloser { return flate.NewReader(r) })

	t := j.f.newTree(nounEntry)
	items := make([]zipItem, 0, len(zr.File))
	for _, zf := range zr.File {
		e, err := j.zipEntry(zf)
		if err != nil {
			return nil, err
		}
		hdrs, err := t.add(e, "")
		if err != nil {
			return nil, err
		}
		it := zipItem{hdrs: hdrs}
		if e.kind == tar.TypeReg && e.size > 0 {
			it.file, it.size = zf, e.size
		}
		items = append(items, it)
	}
	return j.start(func(tw *tar.Writer) error { return j.emitZip(items, tw) }), nil
}

// zipEntry reads what the rules need of one zip entry (a symlink's target is its content).
func (j *job) zipEntry(zf *zip.File) (entry, error) {
	name := zf.Name
	if zf.Flags&0x1 != 0 {
		return entry{}, invalid(nounEntry, name, "is encrypted")
	}
	if zf.Method != zip.Store && zf.Method != zip.Deflate {
		return entry{}, invalid(nounEntry, name, "uses the compression method %d, which is not supported (store and deflate are)", zf.Method)
	}
	if zf.UncompressedSize64 > math.MaxInt64 {
		return entry{}, tooLarge(nounEntry, name, "is over the limit of %d bytes per file", j.f.opts.MaxFileBytes)
	}
	mode := zf.Mode()
	e := entry{name: name, kind: tar.TypeReg, mode: int64(mode.Perm()), mtime: zf.Modified}
	switch {
	case mode&fs.ModeSymlink != 0:
		e.kind = tar.TypeSymlink
		if zf.UncompressedSize64 > tarsafe.MaxPathBytes {
			return entry{}, invalid(nounEntry, name, "is a symlink whose target is longer than 4096 bytes")
		}
		rc, err := zf.Open()
		if err != nil {
			return entry{}, invalid(nounEntry, name, "is malformed: %v", err)
		}
		b, err := io.ReadAll(io.LimitReader(rc, tarsafe.MaxPathBytes+1))
		rc.Close()
		if err != nil {
			return entry{}, invalid(nounEntry, name, "is malformed: %v", err)
		}
		e.target = string(b)
	case mode.IsDir() || strings.HasSuffix(name, "/"):
		e.kind = tar.TypeDir
	case mode&fs.ModeNamedPipe != 0:
		e.kind = tar.TypeFifo
	case mode&fs.ModeSocket != 0:
		e.kind = tarsafe.TypeSocket
	case mode&fs.ModeCharDevice != 0:
		e.kind = tar.TypeChar
	case mode&fs.ModeDevice != 0:
		e.kind = tar.TypeBlock
	case mode&fs.ModeIrregular != 0:
		e.kind = '?'
	default:
		e.size = int64(zf.UncompressedSize64)
		if r := j.f.opts.MaxRatio; r > 0 && e.size > ratioFloor && float64(e.size) > r*float64(zf.CompressedSize64) {
			return entry{}, tooLarge(nounEntry, name, "expands %d bytes to %d, over the compression ratio limit of %g",
				zf.CompressedSize64, e.size, r)
		}
	}
	return e, nil
}

// emitZip writes the checked zip entries. The zip reader stops a file at the size its header
// gives and checks its CRC-32 at the end.
func (j *job) emitZip(items []zipItem, tw *tar.Writer) error {
	buf := make([]byte, 128<<10)
	for _, it := range items {
		for _, h := range it.hdrs {
			if err := tw.WriteHeader(h); err != nil {
				return j.fail(err, h.Name, false)
			}
		}
		if it.file == nil {
			continue
		}
		if err := j.ictx.Err(); err != nil {
			return j.fail(err, it.file.Name, false)
		}
		rc, err := it.file.Open()
		if err != nil {
			return j.fail(err, it.file.Name, false)
		}
		n, err := io.CopyBuffer(tw, io.LimitReader(rc, it.size), buf)
		if err == nil && n < it.size {
			err = io.ErrUnexpectedEOF
		}
		if err == nil {
			// Read past the end: that is where the zip reader checks the CRC-32.
			var one [1]byte
			if m, rerr := io.ReadFull(rc, one[:]); m > 0 {
				err = errors.New("more content than its header says")
			} else if rerr != io.EOF {
				err = rerr
			}
		}
		rc.Close()
		if err != nil {
			return j.fail(err, it.file.Name, false)
		}
	}
	return nil
}

// zipDirectory reads the entry count and the central directory's size from a zip archive's
// end records (zip64 too), the way archive/zip finds them, so that a hostile count is
// refused before archive/zip allocates for it. ok is false when there are no end records
// (archive/zip then refuses the archive).
func zipDirectory(r io.ReaderAt, size int64) (count, dirSize uint64, ok bool) {
	const endLen = 22
	tail := min(size, 65535+endLen)
	buf := make([]byte, tail)
	if _, err := r.ReadAt(buf, size-tail); err != nil && err != io.EOF {
		return 0, 0, false
	}
	i := len(buf) - endLen
	for ; i >= 0; i-- {
		if string(buf[i:i+4]) == "PK\x05\x06" {
			if n := int(binary.LittleEndian.Uint16(buf[i+20:])); i+endLen+n > len(buf) {
				return 0, 0, false
			}
			break
		}
	}
	if i < 0 {
		return 0, 0, false
	}
	end := buf[i:]
	count = uint64(binary.LittleEndian.Uint16(end[10:]))
	dirSize = uint64(binary.LittleEndian.Uint32(end[12:]))
	if count != 0xffff && dirSize != 0xffffffff && binary.LittleEndian.Uint32(end[16:]) != 0xffffffff {
		return count, dirSize, true
	}
	// zip64: the locator is the 20 bytes before the end record and points to the zip64 end.
	loc := size - tail + int64(i) - 20
	var l [20]byte
	if loc < 0 {
		return count, dirSize, true
	}
	if _, err := r.ReadAt(l[:], loc); err != nil || string(l[:4]) != "PK\x06\x07" {
		return count, dirSize, true
	}
	off := int64(binary.LittleEndian.Uint64(l[8:]))
	var z [56]byte
	if off < 0 || off > size-56 {
		return count, dirSize, true
	}
	if _, err := r.ReadAt(z[:], off); err != nil || string(z[:4]) != "PK\x06\x06" {
		return count, dirSize, true
	}
	return binary.LittleEndian.Uint64(z[32:]), binary.LittleEndian.Uint64(z[40:]), true
}

// job is one fetch: its contexts, the download and its counters, and what to release.
type job struct {
	f      *Fetcher
	ctx    context.Context // the caller's
	ictx   context.Context // ctx with the fetch's own timeouts (causes errTimeout, errStalled)
	cancel context.CancelCauseFunc
	host   string // of the archive URL, for messages ("" for GCS)

	stallMu sync.Mutex
	stall   *time.Timer

	body *download // nil for GCS
	xr   *expander // nil for zip and GCS
	out  *outWriter

	closers []func() // run in reverse by release
}

func (f *Fetcher) newJob(ctx context.Context, host string) *job {
	cctx, cancel := context.WithCancelCause(ctx)
	ictx, stop := context.WithTimeoutCause(cctx, f.opts.Timeout, errTimeout)
	j := &job{f: f, ctx: ctx, ictx: ictx, cancel: cancel, host: host}
	j.closers = append(j.closers, func() { stop(); cancel(errClosed) })
	return j
}

// release frees everything the job holds. It runs once, in the stream's goroutine or, when
// no stream started, before Archive or GCSPrefix returns.
func (j *job) release() {
	j.stopStall()
	for i := len(j.closers) - 1; i >= 0; i-- {
		j.closers[i]()
	}
}

func (j *job) startStall() {
	j.stallMu.Lock()
	defer j.stallMu.Unlock()
	j.stall = time.AfterFunc(j.f.opts.StallTimeout, func() { j.cancel(errStalled) })
}

func (j *job) resetStall() {
	j.stallMu.Lock()
	defer j.stallMu.Unlock()
	if j.stall != nil {
		j.stall.Reset(j.f.opts.StallTimeout)
	}
}

func (j *job) stopStall() {
	j.stallMu.Lock()
	defer j.stallMu.Unlock()
	if j.stall != nil {
		j.stall.Stop()
		j.stall = nil
	}
}

// start runs emit in a goroutine that writes a tar stream into a pipe, and returns the
// pipe's reading end. An error of emit ends the stream with that error.
func (j *job) start(emit func(*tar.Writer) error) io.ReadCloser {
	pr, pw := io.Pipe()
	j.out = &outWriter{w: pw}
	s := &stream{pr: pr, cancel: j.cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer j.release()
		bw := bufio.NewWriterSize(j.out, 256<<10)
		tw := tar.NewWriter(bw)
		err := emit(tw)
		if err == nil {
			if err = tw.Close(); err == nil {
				err = bw.Flush()
			}
			if err != nil {
				err = j.fail(err, "", false)
			}
		}
		if err != nil {
			if j.out.err == nil {
				_ = bw.Flush() // what was checked before the error still reaches the consumer
			}
			pw.CloseWithError(err)
			return
		}
		pw.Close()
	}()
	return s
}

// fail classifies an error that ended the reading or writing of the stream. label names the
// entry it happened in (after, when it happened after that entry, reading the next header).
func (j *job) fail(err error, label string, after bool) error {
	if e := (*apierror.Error)(nil); errors.As(err, &e) {
		return e
	}
	if j.out != nil && j.out.err != nil {
		return j.out.err // the consumer closed the stream: it knows
	}
	if j.ctx.Err() != nil {
		return j.ctx.Err()
	}
	if cerr := j.f.causeError(j.ictx); cerr != nil {
		return cerr
	}
	noun := nounEntry
	if j.body == nil {
		noun = "object"
	}
	switch {
	case j.body != nil && j.body.over:
		return tooLarge("", "", "the archive is over the limit of %d bytes", j.body.max)
	case j.body != nil && j.body.err != nil:
		return j.f.unavailable(j.body.err, 0, "the archive download from %q broke: %s", j.host, publicNetError(j.body.err))
	case j.xr != nil && j.xr.over:
		return tooLarge(noun, label, "takes the archive over %d bytes uncompressed", j.xr.max)
	case j.xr != nil && j.xr.ratioHit:
		return tooLarge(noun, label, "takes the archive's compression ratio over the limit of %g", j.xr.ratio)
	case label == "":
		return apierror.Wrap(err, apierror.InvalidArgument, "the archive is malformed: %v", err)
	case after:
		return apierror.Wrap(err, apierror.InvalidArgument, "the archive is malformed after the entry %q: %v", label, err).
			WithDetail("entry", label)
	}
	e := invalid(noun, label, "is malformed: %v", err)
	e.Err = err
	return e
}

// stream is what Archive and GCSPrefix return.
type stream struct {
	pr     *io.PipeReader
	cancel context.CancelCauseFunc
	done   chan struct{}
	once   sync.Once
}

func (s *stream) Read(p []byte) (int, error) { return s.pr.Read(p) }

// Close stops the fetch and waits until its goroutine has ended.
func (s *stream) Close() error {
	s.once.Do(func() {
		s.pr.CloseWithError(errClosed)
		s.cancel(errClosed)
		<-s.done
	})
	return nil
}

// outWriter remembers the first write error (the consumer went away).
type outWriter struct {
	w   io.Writer
	err error
}

func (o *outWriter) Write(p []byte) (int, error) {
	n, err := o.w.Write(p)
	if err != nil && o.err == nil {
		o.err = err
	}
	return n, err
}

var (
	errDownloadLimit = errors.New("source: download over the limit")
	errExpandLimit   = errors.New("source: expansion over the limit")
	errRatioLimit    = errors.New("source: compression ratio over the limit")
)

// download counts the response body, stops it past max and remembers a transport error, so
// that a body that broke is never mistaken for a malformed archive.
type download struct {
	r      io.Reader
	n, max int64
	over   bool
	err    error
	onRead func()
}

func (d *download) Read(p []byte) (int, error) {
	if d.n > d.max {
		d.over = true
		return 0, errDownloadLimit
	}
	if rem := d.max + 1 - d.n; int64(len(p)) > rem {
		p = p[:rem]
	}
	n, err := d.r.Read(p)
	d.n += int64(n)
	if n > 0 && d.onRead != nil {
		d.onRead()
	}
	if err != nil && err != io.EOF && d.err == nil {
		d.err = err
	}
	if d.n > d.max {
		d.over = true
		return n, errDownloadLimit
	}
	return n, err
}

// expander counts the decompressed bytes: it stops them past max and, with a ratio, when
// they outgrow ratio times the compressed bytes read so far.
type expander struct {
	r        io.Reader
	n, max   int64
	over     bool
	ratio    float64
	src      *download
	ratioHit bool
}

func (x *expander) Read(p []byte) (int, error) {
	if x.n >= x.max {
		x.over = true
		return 0, errExpandLimit
	}
	if rem := x.max - x.n; int64(len(p)) > rem {
		p = p[:rem]
	}
	n, err := x.r.Read(p)
	x.n += int64(n)
	if x.src != nil && x.n > ratioFloor && float64(x.n) > x.ratio*float64(x.src.n) {
		x.ratioHit = true
		return n, errRatioLimit
	}
	return n, err
}
