package tracing

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
)

// Config is the tracing section of sandboxd's config. Tracing is off (no tracer provider, no
// exporter, nothing extracted from requests) unless Endpoint is set.
type Config struct {
	// Endpoint is the OTLP/HTTP collector's base address: a URL ("http://collector:4318",
	// "https://otlp.example.com/otlp"; spans go to its path + /v1/traces, as with
	// OTEL_EXPORTER_OTLP_ENDPOINT) or host:port (HTTPS unless Insecure). Empty: tracing off.
	Endpoint string `json:"endpoint"`
	// Insecure sends spans over plain HTTP to a host:port Endpoint. A URL's scheme decides
	// for itself.
	Insecure bool `json:"insecure"`
	// SampleRatio is the share of new traces (requests that carry no traceparent) that are
	// recorded, between 0 and 1 (default 1). A request with a traceparent follows its
	// caller's sampled flag.
	SampleRatio float64 `json:"sample_ratio"`
	// ServiceName is the service.name of the spans (default "sandboxd").
	ServiceName string `json:"service_name"`
}

// DefaultConfig is the section when config says nothing: off, every trace sampled once on.
func DefaultConfig() Config { return Config{SampleRatio: 1, ServiceName: "sandboxd"} }

// On reports whether spans are exported.
func (c Config) On() bool { return c.Endpoint != "" }

// maxServiceName bounds service_name (it is on every exported batch).
const maxServiceName = 64

// Validate reports every problem of c, each naming its setting.
func (c Config) Validate() error {
	var errs []error
	if c.Endpoint != "" {
		if _, err := c.exporterOptions(); err != nil {
			errs = append(errs, err)
		}
	}
	if !(c.SampleRatio >= 0 && c.SampleRatio <= 1) {
		errs = append(errs, fmt.Errorf("tracing.sample_ratio must be between 0 and 1, got %v", c.SampleRatio))
	}
	if c.ServiceName == "" || len(c.ServiceName) > maxServiceName || strings.ContainsFunc(c.ServiceName, isControl) {
		errs = append(errs, fmt.Errorf("tracing.service_name must be 1 to %d printable characters, got %q", maxServiceName, c.ServiceName))
	}
	return errors.Join(errs...)
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// exporterOptions are the OTLP/HTTP exporter's options for c.Endpoint. Headers (a
// collector's credentials) come from OTEL_EXPORTER_OTLP_HEADERS, which the exporter reads
// itself: they never appear in the config file.
func (c Config) exporterOptions() ([]otlptracehttp.Option, error) {
	opts := []otlptracehttp.Option{otlptracehttp.WithCompression(otlptracehttp.GzipCompression), otlptracehttp.WithTimeout(exportTimeout)}
	if strings.Contains(c.Endpoint, "://") {
		u, err := url.Parse(c.Endpoint)
		switch {
		case err != nil:
			return nil, fmt.Errorf("tracing.endpoint: %w", err)
		case u.Scheme != "http" && u.Scheme != "https":
			return nil, fmt.Errorf("tracing.endpoint must be an http or https URL or host:port, got scheme %q", u.Scheme)
		case u.Host == "" || u.Hostname() == "":
			return nil, fmt.Errorf("tracing.endpoint %q has no host", c.Endpoint)
		case u.User != nil:
			return nil, errors.New("tracing.endpoint must not carry credentials: put them in OTEL_EXPORTER_OTLP_HEADERS")
		case u.RawQuery != "" || u.Fragment != "":
			return nil, errors.New("tracing.endpoint must not have a query or fragment")
		case c.Insecure && u.Scheme == "https":
			return nil, errors.New("tracing.insecure contradicts an https tracing.endpoint; use an http URL")
		}
		opts = append(opts, otlptracehttp.WithEndpoint(u.Host), otlptracehttp.WithURLPath(path.Join("/", u.Path, "v1/traces")))
		if u.Scheme == "http" {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		return opts, nil
	}
	host, port, err := net.SplitHostPort(c.Endpoint)
	if err != nil || host == "" || port == "" {
		return nil, fmt.Errorf("tracing.endpoint must be an http(s) URL or host:port, got %q", c.Endpoint)
	}
	opts = append(opts, otlptracehttp.WithEndpoint(c.Endpoint))
	if c.Insecure {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	return opts, nil
}
