package source

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
)

// Config is the sources section of sandboxd's config: what the bootstrap sources of a create
// (source.archive_url and source.gcs_prefix; source.snapshot_id needs nothing) may fetch.
type Config struct {
	// AllowHosts are "host" or "host:port" patterns an archive URL may name even when they
	// resolve to a loopback, private or link-local address (and over plain http): for
	// on-prem mirrors and tests. Empty by default: only public addresses.
	AllowHosts []string `json:"allow_hosts"`
	// CAFile is a PEM file of extra CA certificates that archive hosts are verified
	// against, besides the system's (e.g. an on-prem mirror's, or a test server's).
	CAFile string `json:"ca_file"`
	// GCSPrefixes are the GCS prefixes each "tenant:project" may bootstrap from
	// ("gs://bucket/prefix/"; "gs://bucket" for the whole bucket). None by default.
	GCSPrefixes map[string][]string `json:"gcs_prefixes"`
	// MaxDownloadBytes bounds an archive's download; MaxFiles the entries of a source;
	// MaxTotalBytes its uncompressed content (defaults: 1 GiB, 100,000, 4 GiB). The
	// workspace import applies the same limits.
	MaxDownloadBytes int64 `json:"max_download_bytes"`
	MaxFiles         int   `json:"max_files"`
	MaxTotalBytes    int64 `json:"max_total_bytes"`
}

// DefaultConfig is the section when config says nothing: the Options' limits, no allowed
// hosts, no GCS prefixes.
func DefaultConfig() Config {
	return Config{MaxDownloadBytes: DefaultMaxDownloadBytes, MaxFiles: DefaultMaxFiles, MaxTotalBytes: DefaultMaxTotalBytes}
}

// Validate reports every problem of c, each naming its setting: scopes, prefixes, limits,
// hosts and the CA file (which it reads).
func (c Config) Validate() error {
	var errs []error
	for scope, prefixes := range c.GCSPrefixes {
		if t, p, ok := strings.Cut(scope, ":"); !ok || !auth.ValidID(t) || !auth.ValidID(p) {
			errs = append(errs, fmt.Errorf("sources.gcs_prefixes: %q must be tenant:project", scope))
			continue
		}
		for _, pf := range prefixes {
			if _, _, err := ParseGCSPrefix(pf); err != nil {
				errs = append(errs, fmt.Errorf("sources.gcs_prefixes[%s]: %s (want gs://bucket/prefix/)", scope, apierror.From(err).Message))
			}
		}
	}
	if c.MaxDownloadBytes <= 0 || c.MaxFiles <= 0 || c.MaxTotalBytes <= 0 {
		errs = append(errs, errors.New("sources: max_download_bytes, max_files and max_total_bytes must be > 0"))
	}
	if _, err := c.Options(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Options are the Fetcher's options from c: the limits, the allow list, and the system's
// roots plus the certificates of CAFile (the timeouts take their defaults).
func (c Config) Options() (Options, error) {
	opts := Options{AllowHosts: c.AllowHosts, MaxDownloadBytes: c.MaxDownloadBytes,
		MaxFiles: c.MaxFiles, MaxTotalBytes: c.MaxTotalBytes}
	if c.CAFile != "" {
		data, err := os.ReadFile(c.CAFile)
		if err != nil {
			return opts, fmt.Errorf("sources.ca_file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(data) {
			return opts, fmt.Errorf("sources.ca_file %s holds no PEM certificate", c.CAFile)
		}
		opts.RootCAs = pool
	}
	if _, err := New(opts); err != nil { // checks the allow list
		return opts, fmt.Errorf("sources.allow_hosts: %w", err)
	}
	return opts, nil
}
