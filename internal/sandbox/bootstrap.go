package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/checkpoint"
	"sandboxd/internal/events"
	"sandboxd/internal/source"
	"sandboxd/runtime"
)

// Bootstrap sources. A create's source (a snapshot of the same tenant:project, an HTTPS
// archive, or a GCS prefix that config permits to the tenant:project) fills the new sandbox's
// workspace once, before it is RUNNING:
//   - it is checked before a slot is taken or a box made (the URL's scheme and addresses, the
//     prefix's syntax and permission, the snapshot's existence): cheap refusals first;
//   - it is recorded on the record as an annotation, so that a reconciler finishing an
//     interrupted create fetches it again rather than leaving the sandbox RUNNING empty;
//   - it is streamed straight into the guest's staged workspace import, which discards
//     everything when the stream ends in an error; the create then fails and leaves nothing
//     (abortCreate: box, lookup entry, slot);
//   - a source larger than the sandbox's disk (the profile's disk_mb) is INVALID_ARGUMENT, the
//     same request can never succeed: a snapshot is refused by its manifest's size before
//     anything is read (check, snapshotFits), an archive or prefix when the disk
//     fills up on the way (the guest answers proto.IsNoSpace).
//
// Later execs never fetch again: the workspace lives on the sandbox's disk, and stop/start
// restore it from checkpoints. While an archive or prefix streams, the sandbox's state_reason
// and BOOTSTRAP_PROGRESS events on the project's event stream say how far it is.

// The record annotations that name a sandbox's source (at most one is set).
const (
	// annSourceSnapshot names the snapshot a sandbox was created from.
	annSourceSnapshot = "source_snapshot"
	// annSourceArchive is the archive URL, as given (it may hold a signed URL's token: it is
	// never shown; messages name the redacted form).
	annSourceArchive = "source_archive_url"
	// annSourceGCS is the GCS prefix.
	annSourceGCS = "source_gcs_prefix"
)

// maxArchiveURLBytes bounds an archive URL (a signed URL is long, a record annotation short).
const maxArchiveURLBytes = 4096

// defaultProgressEvery is how often a bootstrap's progress is recorded and published.
const defaultProgressEvery = time.Second

// bootstrapper fills new sandboxes' workspaces from their sources.
type bootstrapper struct {
	sources *source.Fetcher
	objects source.ObjectLister
	// prefixes are the GCS prefixes each "tenant:project" may use (Config.SourcePrefixes).
	prefixes map[string][]string
	ckpts    *checkpoints
	attachs  *attachments
	driver   runtime.Driver
	events   *events.Bus
	metrics  *Metrics
	log      *slog.Logger
	now      func() time.Time
	// every is how often a bootstrap's progress is recorded and published.
	every time.Duration
}

// sourceSpec is a create's checked source: the annotation that names it (key "" for none).
type sourceSpec struct{ key, value string }

// check checks a create's source before anything is spent on the create. diskBytes is
// the disk of the create's profile (0: the runtime's default, not checked): a snapshot known
// to be larger is refused here (its manifest knows its size); an archive or prefix is only
// measured as it streams, and a full disk ends its import with the same INVALID_ARGUMENT.
func (b *bootstrapper) check(ctx context.Context, p auth.Principal, src *Source, diskBytes int64) (sourceSpec, error) {
	if src == nil {
		return sourceSpec{}, nil
	}
	n := 0
	for _, v := range []string{src.SnapshotID, src.ArchiveURL, src.GCSPrefix} {
		if v != "" {
			n++
		}
	}
	switch {
	case n != 1:
		return sourceSpec{}, apierror.New(apierror.InvalidArgument, "source must set exactly one of snapshot_id, archive_url and gcs_prefix, got %d", n).
			WithDetail("field", "source")
	case src.ArchiveURL != "":
		if len(src.ArchiveURL) > maxArchiveURLBytes {
			return sourceSpec{}, apierror.New(apierror.InvalidArgument, "source.archive_url is %d bytes, at most %d", len(src.ArchiveURL), maxArchiveURLBytes).
				WithDetail("field", "source.archive_url")
		}
		if err := b.sources.CheckURL(ctx, src.ArchiveURL); err != nil {
			return sourceSpec{}, sourceError(ctx, err, "source.archive_url")
		}
		return sourceSpec{annSourceArchive, src.ArchiveURL}, nil
	case src.GCSPrefix != "":
		bucket, prefix, err := source.ParseGCSPrefix(src.GCSPrefix)
		if err != nil {
			return sourceSpec{}, sourceError(ctx, err, "source.gcs_prefix")
		}
		if !source.PrefixPermitted(b.permitted(p.Tenant, p.Project), src.GCSPrefix) {
			return sourceSpec{}, apierror.New(apierror.InvalidArgument, "source.gcs_prefix %q is not permitted for this project",
				"gs://"+bucket+"/"+prefix).WithDetail("field", "source.gcs_prefix")
		}
		return sourceSpec{annSourceGCS, src.GCSPrefix}, nil
	}
	m, err := b.snapshotManifest(ctx, p, src.SnapshotID)
	if err != nil {
		return sourceSpec{}, err
	}
	if err := snapshotFits(m, diskBytes); err != nil {
		return sourceSpec{}, err
	}
	return sourceSpec{annSourceSnapshot, src.SnapshotID}, nil
}

// permitted are the GCS prefixes config permits tenant:project to bootstrap from.
func (b *bootstrapper) permitted(tenant, project string) []string {
	return b.prefixes[tenant+":"+project]
}

// restore fills the workspace of the running sandbox from the source it was created
// from (nothing when it has none), replacing what is there: a create, a reconciler finishing
// an interrupted create, and a start that finds a never-checkpointed workspace lost all call
// it. An archive or prefix is fetched again each time; only a create normally does.
func (b *bootstrapper) restore(ctx context.Context, rec runtime.Record) error {
	if u := rec.Annotations[annSourceArchive]; u != "" {
		return b.run(ctx, rec, "source.archive_url", source.RedactURL(u), func(ctx context.Context) (io.ReadCloser, error) {
			return b.sources.Archive(ctx, u)
		})
	}
	if p := rec.Annotations[annSourceGCS]; p != "" {
		return b.run(ctx, rec, "source.gcs_prefix", p, func(ctx context.Context) (io.ReadCloser, error) {
			// Permission is checked again: config may have changed since the create.
			return b.sources.GCSPrefix(ctx, p, b.permitted(rec.Tenant, rec.Project), b.objects)
		})
	}
	if src := sourceOf(rec); src != "" {
		return b.restoreSnapshot(ctx, rec, src)
	}
	return nil
}

// run streams the source that open fetches into the sandbox's workspace through the
// guest's staged import, with the fetcher's limits, recording and publishing progress.
// field names the create's field in errors, label the source in messages (never a secret).
func (b *bootstrapper) run(ctx context.Context, rec runtime.Record, field, label string,
	open func(context.Context) (io.ReadCloser, error)) error {
	start := b.now()
	res, n, err := b.work(ctx, rec, field, label, open)
	b.metrics.lifecycle("bootstrap", outcome(err), b.now().Sub(start))
	if err != nil {
		b.log.Warn("bootstrapping the workspace failed", "sandbox", rec.ID, "source", label, "bytes", n, "err", err)
		return err
	}
	b.log.Info("workspace bootstrapped", "sandbox", rec.ID, "source", label, "files", res.Files, "bytes", res.Bytes,
		"ms", b.now().Sub(start).Milliseconds())
	return nil
}

func (b *bootstrapper) work(ctx context.Context, rec runtime.Record, field, label string,
	open func(context.Context) (io.ReadCloser, error)) (proto.ImportResult, int64, error) {
	g, err := b.attachs.get(ctx, rec.ID)
	if err != nil {
		return proto.ImportResult{}, 0, err
	}
	b.progress(ctx, rec, label, 0)
	rc, err := open(ctx)
	if err != nil {
		return proto.ImportResult{}, 0, sourceError(ctx, err, field)
	}
	defer rc.Close()
	cr := &countingReader{r: rc}
	stop := b.followProgress(ctx, rec, label, cr)
	lim := b.sources.Options()
	res, err := g.ImportWorkspace(ctx, cr, client.ImportOptions{Replace: true,
		MaxFiles: int64(lim.MaxFiles), MaxBytes: lim.MaxTotalBytes})
	stop()
	if err != nil {
		// The source's own refusal (a hostile entry midway, a broken download) is what
		// ended the import; say that, not how the import noticed.
		if serr := cr.failure(); serr != nil {
			return res, cr.n.Load(), sourceError(ctx, serr, field)
		}
		if proto.IsNoSpace(err) {
			return res, cr.n.Load(), apierror.Wrap(err, apierror.InvalidArgument,
				"the %s (%s) holds more than the sandbox's disk can take (%s): the disk was full after %d bytes of it; use a profile with a larger disk",
				field, label, diskLabel(rec.Spec.DiskBytes), cr.n.Load()).WithDetail("field", field)
		}
		return res, cr.n.Load(), b.importError(ctx, rec.ID, err)
	}
	return res, cr.n.Load(), nil
}

// followProgress records and publishes the bytes cr has passed every b.every while the
// import runs; the returned stop ends it and waits until it has.
func (b *bootstrapper) followProgress(ctx context.Context, rec runtime.Record, label string, cr *countingReader) (stop func()) {
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(b.every)
		defer t.Stop()
		var last int64
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if n := cr.n.Load(); n != last {
				last = n
				b.progress(ctx, rec, label, n)
			}
		}
	}()
	return func() {
		close(done)
		<-ended
	}
}

var errNotCreating = errors.New("the sandbox is no longer CREATING")

// progress sets a CREATING sandbox's state_reason to how far its bootstrap is and
// publishes it as a BOOTSTRAP_PROGRESS event. Failures only cost the progress report.
func (b *bootstrapper) progress(ctx context.Context, rec runtime.Record, label string, n int64) {
	ctx = context.WithoutCancel(ctx)
	reason := "bootstrapping from " + label
	if n > 0 {
		reason += fmt.Sprintf(": %.1f MB read", float64(n)/1e6)
	}
	if _, err := b.driver.UpdateRecord(ctx, rec.ID, func(r *runtime.Record) error {
		if State(r.State) != Creating {
			return errNotCreating
		}
		r.StateReason = reason
		return nil
	}); err != nil {
		b.log.Debug("recording bootstrap progress failed", "sandbox", rec.ID, "err", err)
		return
	}
	ev := events.Event{Type: EventBootstrapProgress, SandboxID: rec.ID, At: b.now().UTC(),
		Fields: map[string]string{"state": string(Creating), "reason": reason, "bytes_read": strconv.FormatInt(n, 10)}}
	if _, err := b.events.Publish(ctx, rec.Tenant, rec.Project, ev); err != nil {
		b.log.Warn("publishing bootstrap progress failed", "sandbox", rec.ID, "err", err)
	}
}

// countingReader counts the bytes read through it and keeps the first error other than EOF.
// The import's transport may read it from another goroutine than the one that started it.
type countingReader struct {
	r   io.Reader
	n   atomic.Int64
	mu  sync.Mutex
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	if err != nil && err != io.EOF {
		c.mu.Lock()
		if c.err == nil {
			c.err = err
		}
		c.mu.Unlock()
	}
	return n, err
}

func (c *countingReader) failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// sourceError turns an error of fetching a source into a client error: the source package's
// refusals keep their message and details (the offending entry), with the create's field
// added. A source over a limit is INVALID_ARGUMENT like any other hostile source (the create's
// own body is small: 413 would blame it). A failed fetch stays UNAVAILABLE with its
// Retry-After.
func sourceError(ctx context.Context, err error, field string) error {
	var ae *apierror.Error
	if errors.As(err, &ae) {
		out := &apierror.Error{Code: ae.Code, Message: ae.Message, RetryAfter: ae.RetryAfter,
			Details: maps.Clone(ae.Details), Err: ae.Err}
		if out.Code == apierror.PayloadTooLarge {
			out.Code, out.Err = apierror.InvalidArgument, err // the log keeps the original code
		}
		return out.WithDetail("field", field)
	}
	if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return apierror.Wrap(err, apierror.Unavailable, "the request ended while its %s was fetched", field)
	}
	return apierror.Wrap(err, apierror.Unavailable, "could not fetch the %s", field).WithRetryAfter(time.Second)
}

// importError turns a failed workspace import of a source into a client error.
func (b *bootstrapper) importError(ctx context.Context, id string, err error) error {
	var ge *proto.Error
	if errors.As(err, &ge) && (ge.Code == proto.ErrCodeInvalid || ge.Code == proto.ErrCodeTooLarge) {
		return apierror.Wrap(err, apierror.InvalidArgument, "the workspace import refused the source: %s", ge.Message)
	}
	return b.attachs.guestError(ctx, id, err)
}

// restoreSnapshot restores snapshot src, the source a sandbox was created from, into its
// workspace. Its hash is checked while it streams; a corrupt one is refused whole. A snapshot
// larger than the sandbox's disk is refused before anything is read (its manifest knows its
// size), or when the disk fills up on the way.
func (b *bootstrapper) restoreSnapshot(ctx context.Context, rec runtime.Record, src string) error {
	sc, err := snapshotScope(rec.Tenant, rec.Project, src)
	if err != nil {
		return err
	}
	if m, err := b.ckpts.store.Get(ctx, sc, src); err == nil {
		if err := snapshotFits(m, rec.Spec.DiskBytes); err != nil {
			return err
		}
	}
	if err := b.ckpts.restore(ctx, rec.ID, sc, src); err != nil {
		return b.snapshotError(rec, src, err)
	}
	return nil
}

// snapshotSeed is restoreSnapshot's check and the seed a runtime.WorkspaceSeeder extracts.
func (b *bootstrapper) snapshotSeed(ctx context.Context, rec runtime.Record, src string) (runtime.Seed, checkpoint.Scope, error) {
	sc, err := snapshotScope(rec.Tenant, rec.Project, src)
	if err != nil {
		return nil, sc, err
	}
	if m, err := b.ckpts.store.Get(ctx, sc, src); err == nil {
		if err := snapshotFits(m, rec.Spec.DiskBytes); err != nil {
			return nil, sc, err
		}
	}
	return b.ckpts.seed(sc, src), sc, nil
}

// snapshotError words a failed restore of the source snapshot src for the create's caller.
func (b *bootstrapper) snapshotError(rec runtime.Record, src string, err error) error {
	if proto.IsNoSpace(err) {
		return apierror.Wrap(err, apierror.InvalidArgument,
			"source snapshot %s does not fit the sandbox's disk (%s): the disk filled up while it was restored; use a profile with a larger disk",
			src, diskLabel(rec.Spec.DiskBytes)).WithDetail("field", "source.snapshot_id")
	}
	e := apierror.From(err)
	return apierror.Wrap(err, e.Code, "source snapshot %s: %s", src, e.Message)
}

// snapshotManifest returns the manifest of snapshot id of the caller's tenant:project (another
// project's, or none, is NOT_FOUND).
func (b *bootstrapper) snapshotManifest(ctx context.Context, p auth.Principal, id string) (checkpoint.Manifest, error) {
	sc, err := snapshotScope(p.Tenant, p.Project, id)
	if err != nil {
		return checkpoint.Manifest{}, err
	}
	m, err := b.ckpts.store.Get(ctx, sc, id)
	if err != nil {
		return checkpoint.Manifest{}, snapshotError(err, id)
	}
	return m, nil
}
