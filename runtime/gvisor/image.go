package gvisor

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"sandboxd/runtime"
)

// The memory image of a paused box: its archive (what MemoryImage streams and a resume
// extracts), what made it, and the sums that tell a kept copy still intact.

// imageSums are the sizes and CRC-32C sums of a kept image's files, by name (an image kept
// by an earlier sandboxd has sha256 sums instead, still checked). The kept copy lives in the
// box's folder on this host, out of any workload's reach: its sums guard against what a disk or
// a crash does to it (a torn or lost write), for which a CRC is enough and is read at memory
// speed (the CPU's CRC32 instruction), where a sha256 of a 200 MiB image was a third of a
// resume. The stored copy, which may travel, is sha256-checked by the checkpoint store.
type imageSums map[string]struct {
	Size   int64  `json:"size"`
	CRC32C string `json:"crc32c,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
}

// castagnoli is the CRC-32C table (hardware-accelerated on amd64 and arm64).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// imageFormat is the version of the image archive this driver writes (meta.json's format).
const imageFormat = 1

// imageMeta is meta.json: what made a memory image. A resume refuses an image made by another
// runsc build or on another host (runsc cannot restore it reliably), or by another box.
type imageMeta struct {
	Format    int       `json:"format"`
	Box       string    `json:"box"`
	Runsc     string    `json:"runsc_sha256"`
	Host      string    `json:"host"`
	Network   string    `json:"network"`
	CreatedAt time.Time `json:"created_at"`
}

// imageName is the rule for the files of an image: runsc's (checkpoint.img, pages.img,
// pages_meta.img, …) and meta.json, flat in one folder.
var imageName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}\.(img|json)$`)

// maxImageFiles bounds the files of an image archive.
const maxImageFiles = 32

// maxImageBytes bounds the bytes of an image archive extracted for a box: its memory can
// hold at most its memory limit (twice that, for runsc's own state and metadata), or 16 GiB
// for a box without one.
func maxImageBytes(spec runtime.BoxSpec) int64 {
	if spec.MemoryBytes > 0 {
		return 2*spec.MemoryBytes + 512<<20
	}
	return 16 << 30
}

// imageTimeout bounds one runsc checkpoint or restore of the box: two minutes, plus a second
// for every 16 MiB its image may hold (at least a slow disk's speed). A fixed 30 s, the other
// runsc commands' bound, killed restores of idle boxes on a machine loaded by a test suite,
// and would kill every restore of a large box.
func imageTimeout(spec runtime.BoxSpec) time.Duration {
	return 2*time.Minute + time.Duration(maxImageBytes(spec)>>24)*time.Second
}

// identity is what a memory image made here records of its maker: the runsc binary's sha256
// and the host's machine id. It is computed once per driver (hashing runsc reads ~100 MB).
type identity struct{ runsc, host string }

func (d *Driver) identity() (identity, error) {
	d.identOnce.Do(func() {
		f, err := os.Open(d.opts.Runsc)
		if err != nil {
			d.identErr = fmt.Errorf("gvisor: hashing runsc: %w", err)
			return
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			d.identErr = fmt.Errorf("gvisor: hashing runsc: %w", err)
			return
		}
		d.ident = identity{runsc: hex.EncodeToString(h.Sum(nil)), host: hostID()}
	})
	return d.ident, d.identErr
}

// hostID names this host: its machine id, else its host name.
func hostID() string {
	for _, p := range []string{"/etc/machine-id", "/var/lib/dbus/machine-id"} {
		if b, err := os.ReadFile(p); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			return "machine-id:" + strings.TrimSpace(string(b))
		}
	}
	name, _ := os.Hostname()
	return "hostname:" + name
}

// identCache is the Driver's identity, computed on first use.
type identCache struct {
	identOnce sync.Once
	ident     identity
	identErr  error
	warming   atomic.Bool
}

// warmIdentity computes the identity in the background once a box runs: hashing runsc takes
// about 90 ms here, which the first pause (or resume) of a server would otherwise wait for.
func (d *Driver) warmIdentity() {
	if d.warming.CompareAndSwap(false, true) {
		go func() { _, _ = d.identity() }()
	}
}

// writeImageTar writes the files as a tar stream and returns their sizes and sums.
func writeImageTar(w io.Writer, names []string, files []*os.File) (imageSums, error) {
	sums := imageSums{}
	tw := tar.NewWriter(w)
	for i, f := range files {
		fi, err := f.Stat()
		if err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Name: names[i], Mode: 0o600, Size: fi.Size(), ModTime: fi.ModTime(),
			Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		h := crc32.New(castagnoli)
		if n, err := io.Copy(io.MultiWriter(tw, h), f); err != nil {
			return nil, err
		} else if n != fi.Size() {
			return nil, fmt.Errorf("%s changed while it was read", names[i])
		}
		e := sums[names[i]]
		e.Size, e.CRC32C = fi.Size(), hex.EncodeToString(h.Sum(nil))
		sums[names[i]] = e
	}
	return sums, tw.Close()
}

// checkKept reports whether the kept image may be restored and returns its meta.json. An
// image with sums (MemoryImage streamed it) must still match them; ok is false for one that
// changed, and why says which. An image without sums is one the store has not read yet (a
// pause answers before its image is stored): runsc wrote it whole (the folder is named only
// once it succeeded) and only MemoryImage reads it since, so it is what the store would sum;
// it is restored (why "no sums") when its files are runsc's and its meta.json reads.
func checkKept(dir string) (meta imageMeta, ok bool, why string) {
	var sums imageSums
	b, err := os.ReadFile(filepath.Join(dir, imageSumsFile))
	if errors.Is(err, fs.ErrNotExist) {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return meta, false, err.Error()
		}
		for _, e := range entries {
			if n := e.Name(); n != imageDoneFile && (!e.Type().IsRegular() || !imageName.MatchString(n)) {
				return meta, false, "an unexpected file " + n
			}
		}
		b, err = os.ReadFile(filepath.Join(dir, imageMetaFile))
		if err != nil || json.Unmarshal(b, &meta) != nil {
			return meta, false, "unreadable meta.json"
		}
		return meta, true, "no sums"
	}
	if err != nil {
		return meta, false, "unreadable sums"
	}
	if err := json.Unmarshal(b, &sums); err != nil || len(sums) == 0 {
		return meta, false, "unreadable sums"
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return meta, false, err.Error()
	}
	for _, e := range entries {
		if n := e.Name(); n != imageSumsFile && n != imageDoneFile && sums[n].CRC32C == "" && sums[n].SHA256 == "" {
			return meta, false, "an unexpected file " + n
		}
	}
	for name, want := range sums {
		if name == imageSumsFile {
			// A sum of the sums file itself, which an earlier build took when a store was
			// retried: rewriting the file made it wrong. The image's files decide.
			continue
		}
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return meta, false, err.Error()
		}
		var h hash.Hash = crc32.New(castagnoli)
		sum := want.CRC32C
		if sum == "" {
			h, sum = sha256.New(), want.SHA256
		}
		n, err := io.Copy(h, f)
		f.Close()
		if err != nil || n != want.Size || sum == "" || hex.EncodeToString(h.Sum(nil)) != sum {
			return meta, false, name + " does not match its sum"
		}
	}
	b, err = os.ReadFile(filepath.Join(dir, imageMetaFile))
	if err != nil || json.Unmarshal(b, &meta) != nil {
		return meta, false, "unreadable meta.json"
	}
	return meta, true, ""
}

// extractImage writes the files of an image archive into dir (flat, regular files with
// runsc's names, at most max bytes in all) and reads the stream to its end, so that a reader
// that checks a hash at its end has checked it. It returns meta.json's content.
func extractImage(r io.Reader, dir string, max int64) (imageMeta, error) {
	var meta imageMeta
	tr := tar.NewReader(r)
	var total int64
	seen := map[string]bool{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return meta, readError(err)
		}
		if h.Typeflag != tar.TypeReg || !imageName.MatchString(h.Name) || seen[h.Name] {
			return meta, &runtime.ImageError{Reason: fmt.Sprintf("the image holds an unexpected entry %q", h.Name), Corrupt: true}
		}
		if h.Name == imageSumsFile {
			continue // stored by an earlier build with a retried store: the host's note, not runsc's
		}
		seen[h.Name] = true
		if len(seen) > maxImageFiles {
			return meta, &runtime.ImageError{Reason: "the image holds too many files", Corrupt: true}
		}
		total += h.Size
		if h.Size < 0 || total > max {
			return meta, &runtime.ImageError{Reason: fmt.Sprintf("the image is larger than the %d MiB a box of this size can have", max>>20), Corrupt: true}
		}
		if h.Name == imageMetaFile {
			if h.Size > 64<<10 {
				return meta, &runtime.ImageError{Reason: "the image's meta.json is too large", Corrupt: true}
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				return meta, readError(err)
			}
			if err := json.Unmarshal(b, &meta); err != nil {
				return meta, &runtime.ImageError{Reason: "the image's meta.json is unreadable", Corrupt: true, Err: err}
			}
		}
		f, err := os.OpenFile(filepath.Join(dir, h.Name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return meta, fmt.Errorf("gvisor: extracting the image: %w", err)
		}
		if h.Name == imageMetaFile {
			b, _ := json.Marshal(meta)
			_, err = f.Write(b)
		} else {
			_, err = io.Copy(f, tr)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return meta, readError(err)
		}
	}
	// The rest of the stream (a tar's padding): a hashing reader reports a mismatch at its end.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return meta, readError(err)
	}
	if !seen[imageMetaFile] || !seen["checkpoint.img"] {
		return meta, &runtime.ImageError{Reason: "the image is incomplete (no meta.json or checkpoint.img)", Corrupt: true}
	}
	return meta, nil
}

// readError is the error of an image stream that could not be read: an *ImageError that wraps
// the reader's error (a hash mismatch at the end of a checkpoint stream, or a store that
// failed), which the caller can tell apart; an archive that is not one is Corrupt.
func readError(err error) error {
	var ie *runtime.ImageError
	if errors.As(err, &ie) {
		return err
	}
	corrupt := errors.Is(err, tar.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, tar.ErrFieldTooLong)
	return &runtime.ImageError{Reason: "the image could not be read: " + err.Error(), Corrupt: corrupt, Err: err}
}
