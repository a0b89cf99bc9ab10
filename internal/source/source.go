// Package source fetches a sandbox's bootstrap source (an archive behind an HTTPS URL, or the
// objects under a permitted GCS prefix) and turns it into a normalized tar stream for the
// workspace import, refusing hostile input before anything reaches a sandbox.
//
// The stream holds only regular files, directories, symlinks whose relative targets stay
// inside the root and hard links to earlier regular files, with paths as in the source
// (cleaned, never re-rooted: a single top-level folder is kept), parents before children and
// sane modes. Every refusal is an *apierror.Error: INVALID_ARGUMENT for a hostile or
// malformed source and for a URL or prefix that is not allowed, PAYLOAD_TOO_LARGE for a
// size or count limit, UNAVAILABLE (with a retry hint) when the network fails. A refusal
// about one entry names it in the message and in the detail "entry". README.md lists the
// rules and limits.
package source

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"sandboxd/internal/apierror"
)

// Defaults of Options.
const (
	DefaultMaxDownloadBytes      = 1 << 30
	DefaultMaxFiles              = 100_000
	DefaultMaxTotalBytes         = 4 << 30
	DefaultDialTimeout           = 10 * time.Second
	DefaultTLSHandshakeTimeout   = 10 * time.Second
	DefaultResponseHeaderTimeout = 30 * time.Second
	DefaultStallTimeout          = time.Minute
	DefaultTimeout               = 30 * time.Minute
	DefaultRetryAfter            = 10 * time.Second
)

// Fixed bounds (not options).
const (
	// MaxRedirects is the number of redirects an archive URL may take.
	MaxRedirects = 5
	// maxMetaBytes bounds the sum of all entry names and link targets, which the fetcher
	// keeps in memory to apply the rules.
	maxMetaBytes = 64 << 20
	// maxWalkBytes bounds the work of walking symlink targets (the bytes of the paths it
	// looks up), so that many deep targets cannot make the checks quadratic.
	maxWalkBytes = 256 << 20
	// maxZstdWindow bounds the memory a zstd frame may ask for (zstd --long's default).
	maxZstdWindow = 128 << 20
	// ratioFloor: the compression-ratio guard looks only at content larger than this.
	ratioFloor = 1 << 20
)

// Options configure a Fetcher. Zero values take the defaults.
type Options struct {
	// AllowHosts are "host" or "host:port" patterns (IPv6 as "[::1]:443" or "::1") that may
	// be fetched even when they resolve to a loopback, private, link-local or otherwise
	// non-public address, and over plain http. For tests and for internal mirrors that
	// config names. A pattern without a port matches every port.
	AllowHosts []string

	// DialTimeout bounds one TCP connect (default 10s), TLSHandshakeTimeout the TLS
	// handshake (10s), ResponseHeaderTimeout the wait for the response headers after the
	// request was sent (30s), StallTimeout a pause in the body (1m), Timeout the whole
	// download (30m).
	DialTimeout           time.Duration
	TLSHandshakeTimeout   time.Duration
	ResponseHeaderTimeout time.Duration
	StallTimeout          time.Duration
	Timeout               time.Duration

	// MaxDownloadBytes bounds the bytes of an archive as downloaded (default 1 GiB).
	MaxDownloadBytes int64
	// MaxFiles bounds the entries of a source (default 100,000).
	MaxFiles int
	// MaxTotalBytes bounds the uncompressed content of a source (default 4 GiB). It is
	// counted while streaming, so a decompression bomb is stopped there.
	MaxTotalBytes int64
	// MaxFileBytes bounds one file (default MaxTotalBytes).
	MaxFileBytes int64
	// MaxRatio, when > 0, refuses content that expands more than MaxRatio times its
	// compressed size (looked at once the content passes 1 MiB).
	MaxRatio float64

	// RootCAs are the roots that HTTPS servers are verified against (nil: the system's).
	RootCAs *x509.CertPool
	// TempDir is where a zip archive is spooled ("" for os.TempDir()). The spool file is
	// unlinked as soon as it is created.
	TempDir string
	// RetryAfter is the hint on an UNAVAILABLE error when the server gave none (default 10s).
	RetryAfter time.Duration
}

// Fetcher fetches bootstrap sources. It is safe for concurrent use.
type Fetcher struct {
	opts   Options
	allow  []hostPattern
	client *http.Client
	// lookup resolves a host name (a hook for tests).
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)
}

// New returns a Fetcher with opts.
func New(opts Options) (*Fetcher, error) {
	for _, d := range []struct {
		v    *time.Duration
		def  time.Duration
		name string
	}{
		{&opts.DialTimeout, DefaultDialTimeout, "DialTimeout"},
		{&opts.TLSHandshakeTimeout, DefaultTLSHandshakeTimeout, "TLSHandshakeTimeout"},
		{&opts.ResponseHeaderTimeout, DefaultResponseHeaderTimeout, "ResponseHeaderTimeout"},
		{&opts.StallTimeout, DefaultStallTimeout, "StallTimeout"},
		{&opts.Timeout, DefaultTimeout, "Timeout"},
		{&opts.RetryAfter, DefaultRetryAfter, "RetryAfter"},
	} {
		if *d.v < 0 {
			return nil, fmt.Errorf("source: %s %v < 0", d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if opts.MaxDownloadBytes < 0 || opts.MaxFiles < 0 || opts.MaxTotalBytes < 0 || opts.MaxFileBytes < 0 || opts.MaxRatio < 0 {
		return nil, errors.New("source: negative limit")
	}
	if opts.MaxDownloadBytes == 0 {
		opts.MaxDownloadBytes = DefaultMaxDownloadBytes
	}
	if opts.MaxFiles == 0 {
		opts.MaxFiles = DefaultMaxFiles
	}
	if opts.MaxTotalBytes == 0 {
		opts.MaxTotalBytes = DefaultMaxTotalBytes
	}
	if opts.MaxFileBytes == 0 || opts.MaxFileBytes > opts.MaxTotalBytes {
		opts.MaxFileBytes = opts.MaxTotalBytes
	}
	f := &Fetcher{opts: opts, lookup: defaultLookup}
	for _, p := range opts.AllowHosts {
		hp, err := parseHostPattern(p)
		if err != nil {
			return nil, err
		}
		f.allow = append(f.allow, hp)
	}
	f.client = f.newClient()
	return f, nil
}

// Options returns the options f works with, defaults filled in (a copy).
func (f *Fetcher) Options() Options {
	o := f.opts
	o.AllowHosts = append([]string(nil), f.opts.AllowHosts...)
	return o
}

// CheckURL refuses an archive URL that Archive would refuse before connecting: a scheme
// other than https (http only for an allow-listed host), no host, or a host that is not
// allow-listed and resolves to a loopback, private, link-local or otherwise non-public
// address. It resolves the host (so it may answer UNAVAILABLE when the resolver fails) but
// never connects. Archive checks all of this again, and every redirect and connection too;
// CheckURL lets a caller refuse cheaply before it spends anything on the fetch.
func (f *Fetcher) CheckURL(ctx context.Context, rawURL string) error {
	u, err := f.parseURL(rawURL)
	if err != nil {
		return err
	}
	return f.checkURL(ctx, u)
}

func defaultLookup(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// invalid is an INVALID_ARGUMENT error; with a name, about that entry (noun: what it is,
// "archive entry" or "object").
func invalid(noun, name, format string, args ...any) *apierror.Error {
	return entryErr(apierror.InvalidArgument, noun, name, format, args...)
}

// tooLarge is a PAYLOAD_TOO_LARGE error; with a name, about that entry.
func tooLarge(noun, name, format string, args ...any) *apierror.Error {
	return entryErr(apierror.PayloadTooLarge, noun, name, format, args...)
}

// entryErr: format is the predicate; with a name the message is `<noun> "<name>" <predicate>`
// and the detail "entry" is the name.
func entryErr(code apierror.Code, noun, name, format string, args ...any) *apierror.Error {
	msg := fmt.Sprintf(format, args...)
	if name == "" {
		return apierror.New(code, "%s", msg)
	}
	return apierror.New(code, "%s %q %s", noun, name, msg).WithDetail("entry", name)
}

// unavailable is an UNAVAILABLE error with the retry hint.
func (f *Fetcher) unavailable(cause error, retry time.Duration, format string, args ...any) *apierror.Error {
	if retry <= 0 {
		retry = f.opts.RetryAfter
	}
	return apierror.Wrap(cause, apierror.Unavailable, format, args...).WithRetryAfter(retry)
}
