// Package checkpoint stores sandbox workspaces as checkpoints: a tar stream compressed with
// zstd and streamed (never held in memory) to an ObjectStore, plus a JSON manifest.
//
// The objects of checkpoint n of a sandbox, under Options.Prefix ("checkpoints"):
//
//	{prefix}/{tenant}/{project}/{sandbox}/{n}.tar.zst  the data (n as %010d, so keys sort by n)
//	{prefix}/{tenant}/{project}/{sandbox}/{n}.json     the manifest (Manifest)
//	{prefix}/{tenant}/{project}/{sandbox}/{n}.claim    a Save in flight holds n
//
// Save claims n (a small object written if-not-exists, so two writers never share an n),
// uploads the data object, then writes the manifest if-not-exists and drops the claim. A
// checkpoint exists only once its manifest does: a data object or claim without a manifest is
// a Save in flight or the remains of a crash; listing ignores it and GC removes it after a grace
// period. Delete removes the manifest first, then the data.
//
// The ObjectStore is a LocalStore (a folder: the embedded default) or a GCSStore (a Cloud
// Storage bucket); storetest.Run is the suite both pass.
package checkpoint

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/errgroup"

	"sandboxd/internal/zframes"
)

// Format is the format of the checkpoints this package writes and reads.
const Format = "tar+zstd/v1"

// Errors of Store besides ErrNotFound, ErrInvalidID and ErrInvalidScope.
var (
	// ErrCorrupt means that a checkpoint's objects do not match its manifest (size, sha256,
	// raw size), its data object is missing, or its manifest is unreadable.
	ErrCorrupt = errors.New("checkpoint corrupt")
	// ErrConflict means that Save could not get a sequence number of its own (other writers
	// kept taking them) or lost its number to a writer that does not honour claims.
	ErrConflict = errors.New("checkpoint sequence conflict")
)

// Manifest describes one complete checkpoint; it is stored as JSON next to the data.
type Manifest struct {
	// ID is the snapshot id: "snap_" + the sandbox id's ULID + "_" + N in ten digits.
	ID      string `json:"id"`
	Tenant  string `json:"tenant"`
	Project string `json:"project"`
	Sandbox string `json:"sandbox"`
	// N is the checkpoint's sequence number within the sandbox (from 1, increasing, with gaps
	// where a Save failed; once the newest checkpoint is deleted its N may be used again).
	N int64 `json:"n"`
	// Parent is the id of the snapshot this workspace came from ("" for none); it may belong
	// to another sandbox.
	Parent string `json:"parent"`
	// Object is the key of the data object.
	Object string `json:"object"`
	// Size is the size of the data object (compressed).
	Size int64 `json:"size"`
	// RawSize is the size of the tar stream.
	RawSize int64 `json:"raw_size"`
	// SHA256 is the hex sha256 of the data object (compressed bytes).
	SHA256    string    `json:"sha256"`
	CreatedAt time.Time `json:"created_at"`
	// Format is always Format.
	Format string `json:"format"`
}

// Options configure a Store. The zero value is usable.
type Options struct {
	// Prefix is the key prefix of all checkpoints (default "checkpoints").
	Prefix string
	// ZstdLevel is a zstd command-line level (default 1, like `zstd -1`). The encoder has four
	// speeds: 1-2 fastest, 3-5 default, 6-9 better, 10 and up best.
	ZstdLevel int
	// EncoderConcurrency bounds the zstd encoders of one Save (default GOMAXPROCS). Above 1,
	// the stream is compressed as independent frames of 1 MiB, that many at once (see
	// zframes); 1: one frame, on the goroutine that reads the tar stream and one
	// that writes its blocks.
	EncoderConcurrency int
	// GCGrace is how old a data object or claim without a manifest must be before GC removes
	// it (default 1h). It must exceed the longest Save.
	GCGrace time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Store keeps checkpoints in an ObjectStore. It is safe for concurrent use, also by several
// processes sharing one ObjectStore.
type Store struct {
	objs   ObjectStore
	prefix string
	enc    []zstd.EOption
	frames *zframes.Compressor // nil: one frame (EncoderConcurrency 1)
	grace  time.Duration
	now    func() time.Time
	// tombstones: a deleted checkpoint's number is never taken again (kindDeleted).
	tombstones bool
}

// New returns a Store over objs.
func New(objs ObjectStore, opts Options) *Store {
	s := &Store{objs: objs, prefix: strings.Trim(opts.Prefix, "/"), grace: opts.GCGrace, now: opts.Now, tombstones: true}
	if s.prefix == "" {
		s.prefix = "checkpoints"
	}
	if s.grace <= 0 {
		s.grace = time.Hour
	}
	if s.now == nil {
		s.now = time.Now
	}
	level := opts.ZstdLevel
	if level == 0 {
		level = 1
	}
	conc := opts.EncoderConcurrency
	if conc <= 0 {
		conc = runtime.GOMAXPROCS(0)
	}
	s.enc = []zstd.EOption{
		zstd.WithEncoderLevel(zstd.EncoderLevelFromZstd(level)),
		// Not WithConcurrentBlocks: its 16 MiB jobs took the heap to 170-230 MiB during a Save
		// (it must stay flat) for no gain on two cores.
		zstd.WithEncoderConcurrency(conc),
	}
	if conc > 1 {
		s.frames = zframes.New(conc, zstd.EncoderLevelFromZstd(level))
	}
	return s
}

// Derive returns a Store over the same object store, with the same options, whose keys start
// with prefix instead: another kind of object kept with the same guarantees (atomic saves,
// sha256-checked reads) beside the checkpoints, as the memory images of paused sandboxes are.
// Its objects never show in this Store's lists. Unlike a checkpoint's, the id of one deleted
// may be given again (its ids are the records' to keep, not callers'): a deletion leaves
// nothing behind.
func (s *Store) Derive(prefix string) *Store {
	d := *s
	d.prefix = strings.Trim(prefix, "/")
	d.tombstones = false
	return &d
}

// Object kinds, by key suffix.
const (
	kindData     = ".tar.zst"
	kindManifest = ".json"
	kindClaim    = ".claim"
	// kindDeleted is a deleted checkpoint's tombstone: its number stays taken, so that an id a
	// caller saw never names another checkpoint. Claims count it; GC removes it once a higher
	// number exists (a claim never goes below the highest number anyway).
	kindDeleted = ".deleted"
)

// maxClaims bounds how many numbers Save tries before giving up with ErrConflict.
const maxClaims = 32

func (s *Store) dir(sc Scope) string {
	return s.prefix + "/" + sc.Tenant + "/" + sc.Project + "/" + sc.Sandbox + "/"
}

func (s *Store) key(sc Scope, n int64, kind string) string {
	return s.dir(sc) + fmt.Sprintf("%0*d", seqDigits, n) + kind
}

// parseName splits "0000000003.json" into 3 and ".json".
func parseName(name string) (n int64, kind string, ok bool) {
	if len(name) <= seqDigits {
		return 0, "", false
	}
	digits, kind := name[:seqDigits], name[seqDigits:]
	if kind != kindData && kind != kindManifest && kind != kindClaim && kind != kindDeleted {
		return 0, "", false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, "", false
		}
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n < 1 {
		return 0, "", false
	}
	return n, kind, true
}

// numbers reads a listing of the scope's folder dir: its highest number in use (by any kind of
// object) and the numbers whose checkpoint is complete (has its manifest).
func numbers(objs []ObjectAttrs, dir string) (last int64, complete map[int64]bool) {
	complete = map[int64]bool{}
	for _, o := range objs {
		if n, kind, ok := parseName(strings.TrimPrefix(o.Key, dir)); ok {
			last = max(last, n)
			if kind == kindManifest {
				complete[n] = true
			}
		}
	}
	return last, complete
}

// removable reports whether GC removes an object of number n and kind given the scope's
// highest number last and its complete checkpoints, grace aside: a claim, a part of an
// incomplete checkpoint, a tombstone below the highest number; never a manifest.
func removable(n int64, kind string, last int64, complete map[int64]bool) bool {
	switch kind {
	case kindManifest:
		return false
	case kindDeleted:
		return n < last
	case kindClaim:
		return true
	}
	return !complete[n]
}

// Save stores the tar stream as the sandbox's next checkpoint and returns its manifest.
// parent is the id of the snapshot the workspace came from ("" for none). Save reads
// tarStream to EOF (it does not close it) while compressing and uploading it; when Save fails
// or ctx ends it leaves no manifest and no data object. Save returns only after it has stopped
// reading tarStream, so tarStream should unblock when ctx ends (as a request body does).
func (s *Store) Save(ctx context.Context, sc Scope, tarStream io.Reader, parent string) (saved Manifest, err error) {
	return s.save(ctx, sc, parent, func(pw *io.PipeWriter) (int64, error) { return s.compress(ctx, pw, tarStream) })
}

// SaveCompressed is Save for a stream that is already a zstd-compressed tar (a runtime's
// workspace reader compressed it beside the box, on the node's cores): it is stored as it
// comes, not decompressed and compressed again. It is decoded on the way all the same (a
// window of at most 8 MiB), so that a stream that does not decode whole, or whose tar is
// larger than maxRaw bytes, is never kept, and the manifest's RawSize is the tar's size, which
// Open checks. As for Save, zstream ends with an error, never io.EOF, when what produced it
// failed: a stream cut between two frames decodes as a shorter tar.
func (s *Store) SaveCompressed(ctx context.Context, sc Scope, zstream io.Reader, parent string, maxRaw int64) (saved Manifest, err error) {
	return s.save(ctx, sc, parent, func(pw *io.PipeWriter) (int64, error) { return passThrough(ctx, pw, zstream, maxRaw) })
}

// errTooLarge fails a SaveCompressed whose tar is larger than its bound.
var errTooLarge = errors.New("the tar is larger than its bound")

// passThrough copies the zstd stream zr to pw while a decoder checks it, closes pw (with the
// error, if any) and returns the decoded size.
func passThrough(ctx context.Context, pw *io.PipeWriter, zr io.Reader, maxRaw int64) (int64, error) {
	dr, dw := io.Pipe()
	var raw int64
	decoded := make(chan error, 1)
	go func() {
		dec, err := zstd.NewReader(dr, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(8<<20), zstd.WithDecoderMaxMemory(64<<20))
		if err == nil {
			raw, err = io.CopyBuffer(io.Discard, io.LimitReader(dec, maxRaw+1), make([]byte, 128<<10))
			dec.Close()
		}
		switch {
		case err != nil:
			err = fmt.Errorf("the compressed tar does not decode: %w", err)
		case raw > maxRaw:
			err = fmt.Errorf("%w (%d bytes)", errTooLarge, maxRaw)
		}
		dr.CloseWithError(err) // the copy below then stops at its next write
		decoded <- err
	}()
	_, err := io.CopyBuffer(pw, io.TeeReader(ctxReader{ctx: ctx, r: zr}, dw), make([]byte, 128<<10))
	if err != nil {
		err = fmt.Errorf("read the compressed tar: %w", err)
	}
	dw.CloseWithError(err) // nil: EOF, the decoder checks that the stream ended whole
	// The decoder's failure, when the copy stopped because of it (its write to the decoder
	// failed with that error) or ended well.
	if derr := <-decoded; err == nil || (derr != nil && errors.Is(err, derr)) {
		err = derr
	}
	if err != nil {
		pw.CloseWithError(err)
		return raw, err
	}
	return raw, pw.Close()
}

// save is Save with the data object's bytes from produce, which writes them to pw, closes it
// (with its error, if any) and returns the tar's size.
func (s *Store) save(ctx context.Context, sc Scope, parent string, produce func(pw *io.PipeWriter) (int64, error)) (saved Manifest, err error) {
	ctx, span := startSpan(ctx, "checkpoint.save", sc, "")
	defer func() { endSpan(span, saved, err) }()
	if err := sc.check(); err != nil {
		return Manifest{}, fmt.Errorf("save checkpoint: %w", err)
	}
	if parent != "" {
		if _, _, err := ParseID(parent); err != nil {
			return Manifest{}, fmt.Errorf("save checkpoint: parent: %w", err)
		}
	}
	n, leftovers, err := s.claim(ctx, sc)
	if err != nil {
		return Manifest{}, fmt.Errorf("save checkpoint of %s: %w", sc.Sandbox, err)
	}
	defer s.cleanup(ctx, s.key(sc, n, kindClaim)) // if this fails, GC removes the claim

	m := Manifest{ID: formatID(sc.Sandbox, n), Tenant: sc.Tenant, Project: sc.Project,
		Sandbox: sc.Sandbox, N: n, Parent: parent, Object: s.key(sc, n, kindData), Format: Format}
	if err := s.upload(ctx, &m, produce); err != nil {
		return Manifest{}, fmt.Errorf("save checkpoint %s: %w", m.ID, err)
	}
	m.CreatedAt = s.now().UTC()
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Manifest{}, fmt.Errorf("save checkpoint %s: %w", m.ID, err)
	}
	mkey := s.key(sc, n, kindManifest)
	_, err = s.objs.Put(ctx, mkey, bytes.NewReader(b), PutOptions{IfNotExists: true, ContentType: "application/json"})
	if err == nil {
		if leftovers || n%gcEvery == 0 {
			s.gcAfterSave(ctx, sc)
		}
		return m, nil
	}
	// A Put may fail after storing the object (a lost response), and a store that retries a
	// conditional write after a lost response then reports a precondition failure for its own
	// object (GCS): either way, when the manifest there is ours, the Save is done.
	c, cancel := detached(ctx)
	got, gerr := s.readManifest(c, sc, n)
	cancel()
	if gerr == nil && got.SHA256 == m.SHA256 && got.CreatedAt.Equal(m.CreatedAt) {
		return got, nil
	}
	if errors.Is(err, ErrPrecondition) {
		err = fmt.Errorf("%w: manifest %s exists: %w", ErrConflict, mkey, err)
	}
	if derr := s.cleanup(ctx, m.Object); derr != nil {
		err = fmt.Errorf("%w (and removing the data object: %v)", err, derr)
	}
	return Manifest{}, fmt.Errorf("save checkpoint %s: manifest: %w", m.ID, err)
}

// gcEvery is how often (in sequence numbers) a Save collects garbage when its claim's listing
// saw none: a Save killed before its claim was written leaves only a temporary file, which no
// listing shows.
const gcEvery = 16

// gcAfterSave removes what earlier Saves of the sandbox left behind when their process died
// mid-upload (older than the grace period). It is best effort: the new checkpoint is complete
// whatever happens here, and the next Save tries again. Save runs it when its claim's listing
// saw anything but whole checkpoints (a claim, or a data object without its manifest: another
// Save in flight, or one that died), and every gcEvery numbers.
func (s *Store) gcAfterSave(ctx context.Context, sc Scope) {
	c, cancel := detached(ctx)
	defer cancel()
	_, _ = s.GC(c, sc)
}

// detached returns a context for cleanup that outlives ctx's cancellation.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
}

// cleanup deletes key even when ctx is done; a missing key is no error.
func (s *Store) cleanup(ctx context.Context, key string) error {
	c, cancel := detached(ctx)
	defer cancel()
	if err := s.objs.Delete(c, key); err != nil && !errors.Is(err, ErrNotExist) {
		return err
	}
	return nil
}

// claim takes the sandbox's next free sequence number: the first n above every number in use
// (by a manifest, data object or claim) whose claim object this Save creates. It also reports
// whether its listing held anything but whole checkpoints (leftovers, for gcAfterSave).
func (s *Store) claim(ctx context.Context, sc Scope) (n int64, leftovers bool, err error) {
	objs, err := s.objs.List(ctx, s.dir(sc))
	if err != nil {
		return 0, false, err
	}
	last, complete := numbers(objs, s.dir(sc))
	for _, o := range objs {
		if n, kind, ok := parseName(strings.TrimPrefix(o.Key, s.dir(sc))); ok && removable(n, kind, last, complete) {
			leftovers = true
		}
	}
	body, err := json.Marshal(struct {
		CreatedAt time.Time `json:"created_at"`
	}{s.now().UTC()})
	if err != nil {
		return 0, false, err
	}
	for n := last + 1; n <= last+maxClaims; n++ {
		if n > maxSeq {
			return 0, false, fmt.Errorf("%w: sequence numbers exhausted", ErrConflict)
		}
		ckey := s.key(sc, n, kindClaim)
		_, err := s.objs.Put(ctx, ckey, bytes.NewReader(body), PutOptions{IfNotExists: true})
		if errors.Is(err, ErrPrecondition) {
			continue // another Save holds n
		}
		if err != nil {
			return 0, false, fmt.Errorf("claim %s: %w", ckey, err)
		}
		// n is ours, but a Save that finished since our List has released its claim of n:
		// make sure nothing else uses n.
		used := false
		for _, kind := range []string{kindManifest, kindData} {
			_, err := s.objs.Stat(ctx, s.key(sc, n, kind))
			if err == nil {
				used = true
			} else if !errors.Is(err, ErrNotExist) {
				s.cleanup(ctx, ckey)
				return 0, false, fmt.Errorf("claim %s: %w", ckey, err)
			}
		}
		if !used {
			return n, leftovers, nil
		}
		if err := s.objs.Delete(ctx, ckey); err != nil && !errors.Is(err, ErrNotExist) {
			return 0, false, fmt.Errorf("release %s: %w", ckey, err)
		}
	}
	return 0, false, fmt.Errorf("%w: %d numbers after %d taken", ErrConflict, maxClaims, last)
}

// upload streams what produce writes (the tar compressed, or a compressed tar checked) →
// (sha256, count) → the data object of m, and fills in
// m's sizes and hash. On failure no data object is left (a Put leaves nothing when its
// reader fails; an object stored without the whole stream is deleted).
func (s *Store) upload(ctx context.Context, m *Manifest, produce func(pw *io.PipeWriter) (int64, error)) error {
	pr, pw := io.Pipe()
	var (
		raw   int64
		encEr error
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		raw, encEr = produce(pw)
	}()

	h := sha256.New()
	counted := &countingReader{r: io.TeeReader(pr, h)}
	attrs, err := s.objs.Put(ctx, m.Object, counted, PutOptions{IfNotExists: true,
		ContentType: "application/zstd", Metadata: map[string]string{"snapshot-id": m.ID}})
	// If Put stopped reading early, this unblocks the compressor's writes.
	pr.CloseWithError(errors.New("upload ended"))
	<-done
	switch {
	case errors.Is(err, ErrPrecondition):
		return fmt.Errorf("%w: data object %s exists: %w", ErrConflict, m.Object, err)
	case err != nil:
		return fmt.Errorf("upload: %w", err)
	case encEr != nil || attrs.Size != counted.n:
		// The store reported success without reading the whole stream: do not keep it.
		if derr := s.cleanup(ctx, m.Object); derr != nil {
			return fmt.Errorf("upload: incomplete object of %d bytes (read %d, compress: %v), and removing it: %w",
				attrs.Size, counted.n, encEr, derr)
		}
		return fmt.Errorf("upload: incomplete object of %d bytes (read %d, compress: %v)", attrs.Size, counted.n, encEr)
	}
	m.Size, m.RawSize, m.SHA256 = counted.n, raw, hex.EncodeToString(h.Sum(nil))
	return nil
}

// compress writes the zstd compression of r to pw, closes pw (with the error, if any: the
// reader then never sees io.EOF) and returns the bytes read from r.
func (s *Store) compress(ctx context.Context, pw *io.PipeWriter, r io.Reader) (int64, error) {
	if s.frames != nil {
		n, err := s.frames.Compress(ctx, pw, r)
		if err != nil {
			pw.CloseWithError(err)
			return n, err
		}
		return n, pw.Close()
	}
	enc, err := zstd.NewWriter(pw, s.enc...)
	if err != nil {
		err = fmt.Errorf("zstd: %w", err)
		pw.CloseWithError(err)
		return 0, err
	}
	// Not io.Copy: Encoder.ReadFrom races with its own goroutines when the reader fails
	// (klauspost/compress v1.20.4); the Write path waits for them.
	n, err := io.CopyBuffer(struct{ io.Writer }{enc}, ctxReader{ctx: ctx, r: r}, make([]byte, 128<<10))
	if err != nil {
		err = fmt.Errorf("read tar stream: %w", err)
		pw.CloseWithError(err) // first, so that Close does not flush a valid-looking stream
		enc.Close()            // stops the encoder's goroutines
		return n, err
	}
	if err := enc.Close(); err != nil {
		err = fmt.Errorf("zstd: %w", err)
		pw.CloseWithError(err)
		return n, err
	}
	return n, pw.Close()
}

// Get returns the manifest of the scope's checkpoint id.
func (s *Store) Get(ctx context.Context, sc Scope, id string) (Manifest, error) {
	if err := sc.check(); err != nil {
		return Manifest{}, fmt.Errorf("get checkpoint: %w", err)
	}
	sandbox, n, err := ParseID(id)
	if err != nil {
		return Manifest{}, fmt.Errorf("get checkpoint: %w", err)
	}
	if sandbox != sc.Sandbox {
		return Manifest{}, fmt.Errorf("checkpoint %s of sandbox %s: %w", id, sc.Sandbox, ErrNotFound)
	}
	return s.readManifest(ctx, sc, n)
}

// readManifest reads and checks the manifest of checkpoint n.
func (s *Store) readManifest(ctx context.Context, sc Scope, n int64) (Manifest, error) {
	key := s.key(sc, n, kindManifest)
	rc, _, err := s.objs.Get(ctx, key)
	if errors.Is(err, ErrNotExist) {
		return Manifest{}, fmt.Errorf("checkpoint %s: %w", formatID(sc.Sandbox, n), ErrNotFound)
	}
	if err != nil {
		return Manifest{}, fmt.Errorf("read manifest: %w", err)
	}
	defer rc.Close()
	var m Manifest
	if err := json.NewDecoder(io.LimitReader(rc, 1<<20)).Decode(&m); err != nil {
		if ctx.Err() != nil {
			return Manifest{}, fmt.Errorf("read manifest %s: %w", key, err)
		}
		return Manifest{}, fmt.Errorf("manifest %s: %w: %w", key, ErrCorrupt, err)
	}
	want := Manifest{ID: formatID(sc.Sandbox, n), Tenant: sc.Tenant, Project: sc.Project,
		Sandbox: sc.Sandbox, N: n, Object: s.key(sc, n, kindData), Format: Format}
	if m.ID != want.ID || m.Tenant != want.Tenant || m.Project != want.Project || m.Sandbox != want.Sandbox ||
		m.N != want.N || m.Object != want.Object || m.Format != want.Format || m.Size < 0 || m.RawSize < 0 {
		return Manifest{}, fmt.Errorf("manifest %s: %w: does not describe %s (id %q, object %q, format %q)",
			key, ErrCorrupt, want.ID, m.ID, m.Object, m.Format)
	}
	return m, nil
}

// Open returns the checkpoint's decompressed tar stream and its manifest. The stream hashes
// the stored bytes as it goes; at the end, when the object's size or sha256 (or the tar size)
// differ from the manifest, the final Read returns an error wrapping ErrCorrupt instead of
// io.EOF. A consumer must therefore read to io.EOF (after the tar reader is done, drain the
// rest) before it trusts what it read. Open itself fails with ErrCorrupt when the stored size
// is already wrong or the data object is missing. The caller closes the stream.
func (s *Store) Open(ctx context.Context, sc Scope, id string) (io.ReadCloser, Manifest, error) {
	ctx, span := startSpan(ctx, "checkpoint.restore", sc, id)
	m, err := s.Get(ctx, sc, id)
	if err != nil {
		endSpan(span, Manifest{}, err)
		return nil, Manifest{}, err
	}
	obj, err := s.openObject(ctx, m)
	if err != nil {
		endSpan(span, Manifest{}, err)
		return nil, Manifest{}, err
	}
	// Synchronous decoding: no goroutines, and reads of the object happen inside Read.
	v := newVerifier(obj, m)
	dec, err := zstd.NewReader(v, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(64<<20))
	if err != nil {
		obj.Close()
		err = fmt.Errorf("open checkpoint %s: zstd: %w", id, err)
		endSpan(span, Manifest{}, err)
		return nil, Manifest{}, err
	}
	return &snapshotReader{dec: dec, v: v, obj: obj, m: m, span: span}, m, nil
}

// openObject opens the data object of m, checking its size.
func (s *Store) openObject(ctx context.Context, m Manifest) (io.ReadCloser, error) {
	obj, attrs, err := s.objs.Get(ctx, m.Object)
	if errors.Is(err, ErrNotExist) {
		return nil, corrupt(m, "data object missing")
	}
	if err != nil {
		return nil, fmt.Errorf("open checkpoint %s: %w", m.ID, err)
	}
	if attrs.Size != m.Size {
		obj.Close()
		return nil, corrupt(m, fmt.Sprintf("object has %d bytes, manifest says %d", attrs.Size, m.Size))
	}
	return obj, nil
}

// Verify reads the checkpoint's data object in full and checks its size and sha256 against
// the manifest (without decompressing it). A mismatch is an error wrapping ErrCorrupt.
func (s *Store) Verify(ctx context.Context, sc Scope, id string) (verified Manifest, err error) {
	ctx, span := startSpan(ctx, "checkpoint.verify", sc, id)
	defer func() { endSpan(span, verified, err) }()
	m, err := s.Get(ctx, sc, id)
	if err != nil {
		return Manifest{}, err
	}
	obj, err := s.openObject(ctx, m)
	if err != nil {
		return Manifest{}, err
	}
	defer obj.Close()
	if err := newVerifier(obj, m).finish(); err != nil {
		return Manifest{}, err
	}
	return m, nil
}

// List returns the scope's complete checkpoints, oldest first.
func (s *Store) List(ctx context.Context, sc Scope) ([]Manifest, error) {
	if err := sc.check(); err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	ns, err := s.manifestNumbers(ctx, sc)
	if err != nil {
		return nil, err
	}
	refs := make([]ref, len(ns))
	for i, n := range ns {
		refs[i] = ref{sc, n}
	}
	return s.readManifests(ctx, refs)
}

// ListProject returns the complete checkpoints of every sandbox of tenant:project, ordered
// by sandbox id, then oldest first.
func (s *Store) ListProject(ctx context.Context, tenant, project string) ([]Manifest, error) {
	if !isSegment(tenant) || !isSegment(project) {
		return nil, fmt.Errorf("list checkpoints: %w: tenant %q, project %q", ErrInvalidScope, tenant, project)
	}
	prefix := s.prefix + "/" + tenant + "/" + project + "/"
	objs, err := s.objs.List(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	var refs []ref
	for _, o := range objs {
		sandbox, name, ok := strings.Cut(strings.TrimPrefix(o.Key, prefix), "/")
		if !ok || !isSandboxID(sandbox) {
			continue
		}
		if n, kind, ok := parseName(name); ok && kind == kindManifest {
			refs = append(refs, ref{Scope{Tenant: tenant, Project: project, Sandbox: sandbox}, n})
		}
	}
	return s.readManifests(ctx, refs)
}

// Latest returns the scope's newest complete checkpoint, or ErrNotFound.
func (s *Store) Latest(ctx context.Context, sc Scope) (Manifest, error) {
	if err := sc.check(); err != nil {
		return Manifest{}, fmt.Errorf("latest checkpoint: %w", err)
	}
	ns, err := s.manifestNumbers(ctx, sc)
	if err != nil {
		return Manifest{}, err
	}
	for i := len(ns) - 1; i >= 0; i-- {
		m, err := s.readManifest(ctx, sc, ns[i])
		if errors.Is(err, ErrNotFound) {
			continue // deleted since the listing
		}
		return m, err
	}
	return Manifest{}, fmt.Errorf("latest checkpoint of %s: %w", sc.Sandbox, ErrNotFound)
}

// Delete removes a checkpoint: its manifest first (from then on it does not exist), then its
// data object. It does not read the manifest, so a corrupt checkpoint can be deleted. Its
// number stays taken: when it is the scope's highest, a tombstone (kindDeleted) is written
// before anything is removed.
func (s *Store) Delete(ctx context.Context, sc Scope, id string) error {
	return s.delete(ctx, sc, id, s.tombstones)
}

// delete is Delete, with a tombstone or without (the checkpoint is not the scope's newest, or
// the store's ids may be given again).
func (s *Store) delete(ctx context.Context, sc Scope, id string, tombstone bool) error {
	if err := sc.check(); err != nil {
		return fmt.Errorf("delete checkpoint: %w", err)
	}
	sandbox, n, err := ParseID(id)
	if err != nil {
		return fmt.Errorf("delete checkpoint: %w", err)
	}
	if sandbox != sc.Sandbox {
		return fmt.Errorf("delete checkpoint %s of sandbox %s: %w", id, sc.Sandbox, ErrNotFound)
	}
	if tombstone {
		if err := s.tombstone(ctx, sc, n); err != nil {
			return fmt.Errorf("delete checkpoint %s: %w", id, err)
		}
	}
	if err := s.objs.Delete(ctx, s.key(sc, n, kindManifest)); err != nil {
		if errors.Is(err, ErrNotExist) {
			return fmt.Errorf("delete checkpoint %s: %w", id, ErrNotFound)
		}
		return fmt.Errorf("delete checkpoint %s: %w", id, err)
	}
	if err := s.objs.Delete(ctx, s.key(sc, n, kindData)); err != nil && !errors.Is(err, ErrNotExist) {
		return fmt.Errorf("delete checkpoint %s: data (GC removes it later): %w", id, err)
	}
	return nil
}

// tombstone writes checkpoint n's tombstone when n is the scope's highest number (a higher one
// keeps it taken already). A checkpoint that does not exist is ErrNotFound and gets none: the
// delete of a made-up number must not use up the sequence below it.
func (s *Store) tombstone(ctx context.Context, sc Scope, n int64) error {
	objs, err := s.objs.List(ctx, s.dir(sc))
	if err != nil {
		return err
	}
	found, highest := false, true
	for _, o := range objs {
		m, kind, ok := parseName(strings.TrimPrefix(o.Key, s.dir(sc)))
		switch {
		case !ok:
		case m == n && kind == kindManifest:
			found = true
		case m > n:
			highest = false
		}
	}
	if !found {
		return ErrNotFound
	}
	if !highest {
		return nil
	}
	_, err = s.objs.Put(ctx, s.key(sc, n, kindDeleted), bytes.NewReader(nil), PutOptions{IfNotExists: true})
	if err != nil && !errors.Is(err, ErrPrecondition) {
		return fmt.Errorf("its tombstone: %w", err)
	}
	return nil
}

// GC removes the scope's garbage and returns the keys it removed: data objects and claims
// without a manifest that are older than Options.GCGrace (a crashed Save), claims whose
// checkpoint is complete, and tombstones below the highest number (removable).
func (s *Store) GC(ctx context.Context, sc Scope) ([]string, error) {
	if err := sc.check(); err != nil {
		return nil, fmt.Errorf("gc checkpoints: %w", err)
	}
	objs, err := s.objs.List(ctx, s.dir(sc))
	if err != nil {
		return nil, fmt.Errorf("gc checkpoints: %w", err)
	}
	last, complete := numbers(objs, s.dir(sc))
	cutoff := s.now().Add(-s.grace)
	var removed []string
	for _, o := range objs {
		n, kind, ok := parseName(strings.TrimPrefix(o.Key, s.dir(sc)))
		if !ok || !removable(n, kind, last, complete) {
			continue
		}
		// A part of an incomplete checkpoint may be a Save in flight: it goes once it is older
		// than the grace.
		if kind != kindDeleted && !complete[n] && !o.Created.Before(cutoff) {
			continue
		}
		if err := s.objs.Delete(ctx, o.Key); err != nil && !errors.Is(err, ErrNotExist) {
			return removed, fmt.Errorf("gc checkpoints: %w", err)
		}
		removed = append(removed, o.Key)
	}
	// A store whose unfinished uploads leave files behind (the local folder; an interrupted
	// GCS upload leaves no object) removes those too.
	if t, ok := s.objs.(staleTempRemover); ok {
		temps, err := t.RemoveStaleTemps(ctx, s.dir(sc), cutoff)
		removed = append(removed, temps...)
		if err != nil {
			return removed, fmt.Errorf("gc checkpoints: %w", err)
		}
	}
	return removed, nil
}

// staleTempRemover is implemented by object stores that keep unfinished uploads as files.
type staleTempRemover interface {
	RemoveStaleTemps(ctx context.Context, prefix string, before time.Time) ([]string, error)
}

// Retain deletes all but the newest keep checkpoints of the scope and returns the deleted
// ones, oldest first. The ids in protect are never deleted (a sandbox's recorded latest
// checkpoint, say); they count towards keep when they are among the newest.
func (s *Store) Retain(ctx context.Context, sc Scope, keep int, protect ...string) ([]Manifest, error) {
	if keep < 0 {
		return nil, fmt.Errorf("retain checkpoints: keep %d < 0", keep)
	}
	all, err := s.List(ctx, sc)
	if err != nil {
		return nil, err
	}
	var deleted []Manifest
	for _, m := range all[:max(len(all)-keep, 0)] {
		if slices.Contains(protect, m.ID) {
			continue
		}
		// Only the newest needs a tombstone: a higher number keeps the others taken.
		newest := m.ID == all[len(all)-1].ID
		if err := s.delete(ctx, sc, m.ID, s.tombstones && newest); err != nil && !errors.Is(err, ErrNotFound) {
			return deleted, fmt.Errorf("retain checkpoints: %w", err)
		}
		deleted = append(deleted, m)
	}
	return deleted, nil
}

// manifestNumbers lists the numbers of the scope's manifests, ascending.
func (s *Store) manifestNumbers(ctx context.Context, sc Scope) ([]int64, error) {
	objs, err := s.objs.List(ctx, s.dir(sc))
	if err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	var ns []int64
	for _, o := range objs { // sorted by key, so by n
		if n, kind, ok := parseName(strings.TrimPrefix(o.Key, s.dir(sc))); ok && kind == kindManifest {
			ns = append(ns, n)
		}
	}
	return ns, nil
}

type ref struct {
	sc Scope
	n  int64
}

// readManifests reads manifests in parallel, keeping their order and skipping those deleted
// since they were listed.
func (s *Store) readManifests(ctx context.Context, refs []ref) ([]Manifest, error) {
	out := make([]Manifest, len(refs))
	found := make([]bool, len(refs))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i, r := range refs {
		g.Go(func() error {
			m, err := s.readManifest(gctx, r.sc, r.n)
			if errors.Is(err, ErrNotFound) {
				return nil
			}
			if err != nil {
				return err
			}
			out[i], found[i] = m, true
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	list := out[:0]
	for i, m := range out {
		if found[i] {
			list = append(list, m)
		}
	}
	return list, nil
}
