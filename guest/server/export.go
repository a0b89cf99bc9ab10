package server

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"sandboxd/guest/proto"
)

// handleExport streams the workspace as a tar: directories, regular files and symlinks (as
// symlinks); hard links become regular files, sockets and devices are skipped. With
// ?compress=zstd the tar is zstd-compressed (Content-Encoding: zstd; the fastest level, a
// 1 MiB window): a runtime whose stream into the box is narrow (Kubernetes' exec through the
// API server) then carries a fraction of the bytes. The entry count is sent as the trailer
// X-Sbx-Files. A failure midway aborts the stream, so a client never mistakes a partial tar
// for a whole one.
func (s *Server) handleExport(w http.ResponseWriter, r *http.Request) {
	if _, err := os.Stat(s.ws); err != nil {
		writeError(w, fsError(err))
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set("Trailer", proto.HeaderFiles)
	out := io.Writer(w)
	var zw *zstd.Encoder
	if r.URL.Query().Get("compress") == "zstd" {
		var err error
		zw, err = NewExportEncoder(w, 1)
		if err != nil {
			writeError(w, errorf(proto.ErrCodeInternal, "zstd: %v", err))
			return
		}
		w.Header().Set("Content-Encoding", "zstd")
		out = zw
	}
	w.WriteHeader(http.StatusOK)
	files, err := WriteTar(r.Context(), s.ws, out)
	if err == nil && zw != nil {
		err = zw.Close()
	}
	if err != nil {
		if r.Context().Err() == nil {
			s.log.Warn("guest: workspace export failed", "err", err)
		}
		panic(http.ErrAbortHandler)
	}
	w.Header().Set(proto.HeaderFiles, strconv.Itoa(files))
}

// ExportWindow is the zstd window of a compressed export: what a client's decoder must hold.
const ExportWindow = 1 << 20

// NewExportEncoder is the encoder of a compressed export: the fastest level and an
// ExportWindow window, on up to concurrency goroutines (1 in the guest, whose init runs on one
// thread under gVisor).
func NewExportEncoder(w io.Writer, concurrency int) (*zstd.Encoder, error) {
	return zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(max(concurrency, 1)),
		zstd.WithWindowSize(ExportWindow), zstd.WithLowerEncoderMem(true))
}

// WriteTar writes the tree under dir to w as an uncompressed tar (directories, regular files,
// symlinks as symlinks; sockets, devices and FIFOs skipped; the guest's own temporary files
// left out) and returns the number of entries. It never follows a symlink, so it is safe on a
// tree that untrusted code changes while it runs. The local driver uses it on the host
// workspace folder; the guest init on /workspace.
func WriteTar(ctx context.Context, dir string, w io.Writer) (int, error) {
	return writeTar(ctx, dir, w, false)
}

// WriteTarReadahead is WriteTar for a host kernel's file system: a helper runs ahead of the
// walk and asks the kernel to read the next regular files' first bytes in the background
// (posix_fadvise WILLNEED), so that the walk does not wait on one read at a time where the
// page cache is cold (a box's disk image freshly mounted through a loop device). gVisor
// ignores the hint, so the guest init uses plain WriteTar.
func WriteTarReadahead(ctx context.Context, dir string, w io.Writer) (int, error) {
	return writeTar(ctx, dir, w, true)
}

func writeTar(ctx context.Context, dir string, w io.Writer, readahead bool) (int, error) {
	top, err := os.OpenFile(dir, os.O_RDONLY|unix.O_NOATIME, 0)
	if errors.Is(err, unix.EPERM) {
		top, err = os.Open(dir)
	}
	if err != nil {
		return 0, err
	}
	defer top.Close()
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	// Batch tar's many small writes (a 512-byte header per entry) into large writes: each
	// write to an HTTP/2 response is a round trip with the connection's serving goroutine.
	bw := bufio.NewWriterSize(w, 1<<20)
	e := &exporter{ctx: ctx, tw: tar.NewWriter(bw), buf: *bp, readahead: readahead}
	if err := e.dir(top, ""); err != nil {
		return e.files, err
	}
	if err := e.tw.Close(); err != nil {
		return e.files, err
	}
	return e.files, bw.Flush()
}

// exporter walks the workspace with directory descriptors: every stat and open is one
// syscall relative to its parent's descriptor (no per-component path resolution, which costs a
// gofer round trip per component under gVisor), never following a symlink.
type exporter struct {
	ctx       context.Context
	tw        *tar.Writer
	buf       []byte
	files     int
	readahead bool
}

// Readahead's bounds: how many entries of a directory the helper runs ahead of the walk, and
// how much of one file it asks for.
const (
	readaheadEntries = 64
	readaheadBytes   = 4 << 20
)

// readahead asks the kernel to start reading the regular files among ents (entries of the
// directory dirfd) while the walk, at index *at, writes the ones before them: at most
// readaheadEntries ahead of it. Each file is opened without following links and closed at
// once; the walk opens and checks it again itself, so the hint changes nothing but the page
// cache. stop ends it; it returns when it is done.
func readahead(dirfd int, ents []os.DirEntry, at *atomic.Int64, moved <-chan struct{}, stop <-chan struct{}) {
	for i, ent := range ents {
		if !ent.Type().IsRegular() {
			continue
		}
		for int64(i) > at.Load()+readaheadEntries {
			select {
			case <-moved:
			case <-stop:
				return
			}
		}
		if int64(i) < at.Load() {
			continue // the walk is past it
		}
		select {
		case <-stop:
			return
		default:
		}
		fd, err := unix.Openat(dirfd, ent.Name(), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOATIME, 0)
		if err == unix.EPERM { // O_NOATIME on a file that is not ours
			fd, err = unix.Openat(dirfd, ent.Name(), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		}
		if err != nil {
			continue
		}
		_ = unix.Fadvise(fd, 0, readaheadBytes, unix.FADV_WILLNEED)
		unix.Close(fd)
	}
}

// dir writes the entries of the open directory d, whose archive path is prefix ("" for the
// workspace itself, else ending in "/").
func (e *exporter) dir(d *os.File, prefix string) error {
	dirfd := int(d.Fd())
	for {
		ents, rerr := d.ReadDir(512)
		if err := e.batch(dirfd, ents, prefix); err != nil {
			return err
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// batch writes ents, entries of the directory dirfd, with the readahead helper beside it when
// the exporter has one.
func (e *exporter) batch(dirfd int, ents []os.DirEntry, prefix string) error {
	var at atomic.Int64
	moved := make(chan struct{}, 1)
	if e.readahead && len(ents) > 1 {
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			readahead(dirfd, ents, &at, moved, stop)
		}()
		defer func() {
			close(stop)
			<-done // dirfd stays open until the helper is done with it
		}()
	}
	parent := "."
	if prefix != "" {
		parent = strings.TrimSuffix(prefix, "/")
	}
	for i, ent := range ents {
		at.Store(int64(i))
		select {
		case moved <- struct{}{}:
		default:
		}
		name := ent.Name()
		if hiddenName(parent, name) {
			continue
		}
		if err := e.ctx.Err(); err != nil {
			return err
		}
		if err := e.entry(dirfd, name, prefix+name); err != nil {
			return err
		}
	}
	return nil
}

func (e *exporter) entry(dirfd int, name, p string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if err == unix.ENOENT {
			return nil // removed while we walked
		}
		return &fs.PathError{Op: "lstat", Path: p, Err: err}
	}
	hdr := &tar.Header{Name: p, Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix())}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		// O_NOATIME: reading a folder for a checkpoint is no change of it (nor a write of the
		// disk, which a workspace's version counts: runtime.WorkspaceExporter).
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NOATIME, 0)
		if err == unix.EPERM { // O_NOATIME on a folder that is not ours
			fd, err = unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		}
		if err != nil {
			if err == unix.ENOENT || err == unix.ELOOP || err == unix.ENOTDIR {
				return nil
			}
			return &fs.PathError{Op: "open", Path: p, Err: err}
		}
		sub := os.NewFile(uintptr(fd), p)
		defer sub.Close()
		if !sameFile(fd, &st) {
			return nil // swapped while we walked (e.g. for a symlink): skip it
		}
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
		if err := e.tw.WriteHeader(hdr); err != nil {
			return err
		}
		e.files++
		return e.dir(sub, hdr.Name)
	case unix.S_IFLNK:
		buf := make([]byte, 4096)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return nil
		}
		hdr.Typeflag = tar.TypeSymlink
		hdr.Linkname = string(buf[:n])
		e.files++
		return e.tw.WriteHeader(hdr)
	case unix.S_IFREG:
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOATIME, 0)
		if err == unix.EPERM {
			fd, err = unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		}
		if err != nil {
			if err == unix.ENOENT || err == unix.ELOOP {
				return nil
			}
			return &fs.PathError{Op: "open", Path: p, Err: err}
		}
		f := os.NewFile(uintptr(fd), p)
		defer f.Close()
		var fst unix.Stat_t
		if err := unix.Fstat(fd, &fst); err != nil {
			return &fs.PathError{Op: "stat", Path: p, Err: err}
		}
		if fst.Mode&unix.S_IFMT != unix.S_IFREG {
			return nil
		}
		hdr.Typeflag = tar.TypeReg
		hdr.Size = fst.Size
		hdr.Mode = int64(fst.Mode & 0o7777)
		hdr.ModTime = time.Unix(fst.Mtim.Unix())
		if err := e.tw.WriteHeader(hdr); err != nil {
			return err
		}
		n, err := io.CopyBuffer(e.tw, io.LimitReader(f, hdr.Size), e.buf)
		if err != nil {
			return err
		}
		if n < hdr.Size {
			// The file shrank while we read it: pad, to keep the archive consistent.
			if _, err := io.CopyN(e.tw, zeroReader{}, hdr.Size-n); err != nil {
				return err
			}
		}
		e.files++
		return nil
	}
	return nil // sockets, devices, FIFOs
}

// sameFile reports whether the open descriptor fd is the file st describes.
func sameFile(fd int, st *unix.Stat_t) bool {
	var got unix.Stat_t
	return unix.Fstat(fd, &got) == nil && got.Dev == st.Dev && got.Ino == st.Ino
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
