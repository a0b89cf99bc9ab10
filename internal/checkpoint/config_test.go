package checkpoint_test

import (
	"strings"
	"testing"

	"sandboxd/internal/checkpoint"
)

func TestConfig(t *testing.T) {
	if err := checkpoint.DefaultConfig().Validate(); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	c := checkpoint.Config{Store: "gcs", GCSBucket: "b", GCSPrefix: "p", KeepLast: 1}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if o := c.GCSOptions(); o.Bucket != "b" || o.Prefix != "p" {
		t.Errorf("GCS options: %+v", o)
	}
	for _, tt := range []struct {
		c    checkpoint.Config
		want string
	}{
		{checkpoint.Config{Store: "gcs", KeepLast: 1}, "checkpoints.gcs_bucket"},
		{checkpoint.Config{Store: "s3", KeepLast: 1}, `checkpoints.store must be local or gcs, got "s3"`},
		{checkpoint.Config{}, "checkpoints.keep_last"},
	} {
		if err := tt.c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: got %v, want an error mentioning %q", tt.c, err, tt.want)
		}
	}
}
