package tracing

import (
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		edit    func(*Config)
		wantErr string // "" for valid
	}{
		{"off", func(c *Config) {}, ""},
		{"http_url", func(c *Config) { c.Endpoint = "http://collector:4318" }, ""},
		{"https_url_with_path", func(c *Config) { c.Endpoint = "https://otlp.example.com/otlp" }, ""},
		{"host_port", func(c *Config) { c.Endpoint = "collector:4318" }, ""},
		{"host_port_insecure", func(c *Config) { c.Endpoint, c.Insecure = "collector:4318", true }, ""},
		{"ratio_zero", func(c *Config) { c.SampleRatio = 0 }, ""},
		{"no_port", func(c *Config) { c.Endpoint = "collector" }, "tracing.endpoint must be an http(s) URL or host:port"},
		{"grpc_scheme", func(c *Config) { c.Endpoint = "grpc://collector:4317" }, `got scheme "grpc"`},
		{"no_host", func(c *Config) { c.Endpoint = "http://:4318" }, "has no host"},
		{"credentials", func(c *Config) { c.Endpoint = "https://user:secret@collector" }, "must not carry credentials"},
		{"query", func(c *Config) { c.Endpoint = "http://collector:4318/?token=x" }, "must not have a query"},
		{"https_insecure", func(c *Config) { c.Endpoint, c.Insecure = "https://collector", true }, "contradicts"},
		{"ratio_above_one", func(c *Config) { c.SampleRatio = 1.5 }, "tracing.sample_ratio must be between 0 and 1"},
		{"ratio_negative", func(c *Config) { c.SampleRatio = -0.1 }, "tracing.sample_ratio"},
		{"no_service_name", func(c *Config) { c.ServiceName = "" }, "tracing.service_name"},
		{"long_service_name", func(c *Config) { c.ServiceName = strings.Repeat("s", 65) }, "tracing.service_name"},
		{"control_in_service_name", func(c *Config) { c.ServiceName = "a\nb" }, "tracing.service_name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.edit(&c)
			err := c.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("got %v, want valid", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("got %v, want an error saying %q", err, tc.wantErr)
			}
		})
	}
}

// Off means no exporter: Setup installs nothing and its shutdown does nothing.
func TestSetupOffInstallsNothing(t *testing.T) {
	stop, err := Setup(t.Context(), DefaultConfig(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := stop(t.Context()); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	if _, ok := tracer("x").Start(t.Context(), "s"); ok.IsRecording() {
		t.Error("tracing off: got a recording span, want the no-op provider's")
	}
	// A request passes untouched: its traceparent is not parsed, its context not wrapped.
	r := httptest.NewRequest(http.MethodGet, "/sandbox/sandboxes/v1", nil)
	r.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	ctx, end := StartServer(r)
	end("/sandbox/sandboxes/v1", 200)
	if ctx != r.Context() || installed.Load() {
		t.Error("tracing off: StartServer made a span context")
	}
}

func TestEnclosing(t *testing.T) {
	for in, want := range map[string]string{
		"sandboxd/internal/quota.(*Quota).Acquire":         "sandboxd/internal/quota.(*Quota).Acquire",
		"sandboxd/internal/quota.(*Quota).Acquire.func1":   "sandboxd/internal/quota.(*Quota).Acquire",
		"sandboxd/internal/store.(*Store).Lock.func1.2":    "sandboxd/internal/store.(*Store).Lock",
		"sandboxd/internal/store.init.func3":               "sandboxd/internal/store.init",
		"sandboxd/internal/x.func1":                        "sandboxd/internal/x",
		"sandboxd/internal/execstream.(*Store).functional": "sandboxd/internal/execstream.(*Store).functional",
	} {
		if got := enclosing(in); got != want {
			t.Errorf("enclosing(%q) = %q, want %q", in, got, want)
		}
	}
}

// A collector that is down is logged once a minute, not once per failed export.
func TestErrorLogIsRateLimited(t *testing.T) {
	var buf strings.Builder
	e := &errorLog{log: slog.New(slog.NewTextHandler(&buf, nil)), every: time.Hour}
	for range 5 {
		e.Handle(errors.New("connection refused"))
	}
	if n := strings.Count(buf.String(), "exporting spans failed"); n != 1 {
		t.Fatalf("got %d log lines, want 1:\n%s", n, buf.String())
	}
	e.last = time.Now().Add(-2 * time.Hour)
	e.Handle(errors.New("connection refused"))
	if !strings.Contains(buf.String(), "errors_since_last_log=4") {
		t.Errorf("the second line does not count the 4 errors it skipped:\n%s", buf.String())
	}
}
