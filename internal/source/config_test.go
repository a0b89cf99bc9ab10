package source_test

import (
	"strings"
	"testing"

	"sandboxd/internal/source"
)

func TestConfig(t *testing.T) {
	c := source.DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	o, err := c.Options()
	if err != nil {
		t.Fatal(err)
	}
	if o.MaxDownloadBytes != source.DefaultMaxDownloadBytes || o.MaxFiles != source.DefaultMaxFiles ||
		o.MaxTotalBytes != source.DefaultMaxTotalBytes || o.RootCAs != nil || len(o.AllowHosts) != 0 {
		t.Errorf("default options: %+v", o)
	}
	c.GCSPrefixes = map[string][]string{"acme": {"gs://b/x/"}, "acme:evals": {"gs://b/../"}}
	c.MaxFiles = 0
	c.CAFile = "/nonexistent/ca.pem"
	err = c.Validate()
	for _, want := range []string{`sources.gcs_prefixes: "acme" must be tenant:project`, "sources.gcs_prefixes[acme:evals]",
		"max_files", "sources.ca_file"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want an error mentioning %q", err, want)
		}
	}
}
