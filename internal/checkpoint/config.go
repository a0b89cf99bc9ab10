package checkpoint

import (
	"errors"
	"fmt"
)

// Config is the checkpoints section of sandboxd's config: where workspace checkpoints live
// and how many of each sandbox are kept. (The local store's folder is sandboxd's top-level
// checkpoint_dir.)
type Config struct {
	// Store is "local" (the local folder, the default) or "gcs".
	Store string `json:"store"`
	// GCSBucket and GCSPrefix locate the objects in GCS. Credentials come from the
	// application-default chain; STORAGE_EMULATOR_HOST points the client at an emulator.
	GCSBucket string `json:"gcs_bucket"`
	GCSPrefix string `json:"gcs_prefix"`
	// KeepLast is how many snapshots of each sandbox are kept (default 10): after every
	// checkpoint (stop, destroy, snapshot) older ones are deleted, never the latest.
	KeepLast int `json:"keep_last"`
}

// DefaultConfig is the section when config says nothing: the local store, 10 kept.
func DefaultConfig() Config { return Config{KeepLast: 10} }

// Validate reports every problem of c, each naming its setting.
func (c Config) Validate() error {
	var errs []error
	switch c.Store {
	case "", "local":
	case "gcs":
		if c.GCSBucket == "" {
			errs = append(errs, errors.New("checkpoints.store gcs needs checkpoints.gcs_bucket"))
		}
	default:
		errs = append(errs, fmt.Errorf("checkpoints.store must be local or gcs, got %q", c.Store))
	}
	if c.KeepLast < 1 {
		errs = append(errs, fmt.Errorf("checkpoints.keep_last must be at least 1, got %d", c.KeepLast))
	}
	return errors.Join(errs...)
}

// GCSOptions are the GCS store's options from c (store gcs; the client is made by
// NewGCSStore).
func (c Config) GCSOptions() GCSOptions { return GCSOptions{Bucket: c.GCSBucket, Prefix: c.GCSPrefix} }
