package tracing_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/tracing"
	"sandboxd/internal/tracing/tracingtest"
	"sandboxd/runtime/runtimetest"
)

// Setup with an endpoint exports spans over OTLP/HTTP (protobuf, gzip) to a collector, in
// either form of the endpoint; a request's traceparent is honoured and the resource names
// the service.
func TestSetupExportsToACollector(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(url string) tracing.Config
	}{
		{"url", func(url string) tracing.Config {
			c := tracing.DefaultConfig()
			c.Endpoint, c.ServiceName = url, "sandboxd-test"
			return c
		}},
		{"host_port_insecure", func(url string) tracing.Config {
			c := tracing.DefaultConfig()
			c.Endpoint, c.Insecure, c.ServiceName = strings.TrimPrefix(url, "http://"), true, "sandboxd-test"
			return c
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recv := tracingtest.Start(t)
			t.Cleanup(tracing.Uninstall)
			stop, err := tracing.Setup(t.Context(), tc.cfg(recv.URL), tracing.Options{Version: "v9.9.9"})
			if err != nil {
				t.Fatal(err)
			}
			d := tracing.Driver(runtimetest.NewFakeT(t))
			r := httptest.NewRequest(http.MethodGet, "/sandbox/sandboxes/v1/sbx_01EXPORT", nil)
			r.Header.Set("traceparent", traceparent)
			ctx, end := tracing.StartServer(r)
			_, _ = d.Get(ctx, "sbx_01EXPORT")
			end("/sandbox/sandboxes/v1/{id}", 404)
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := stop(sctx); err != nil {
				t.Fatalf("shutdown: %v", err)
			}
			spans := recv.WaitFor(t, parentTrace, 5*time.Second, func(s []tracingtest.Span) bool { return len(s) >= 2 })
			byName := map[string]tracingtest.Span{}
			for _, s := range spans {
				byName[s.Name] = s
			}
			server, ok := byName["GET /sandbox/sandboxes/v1/{id}"]
			if !ok {
				t.Fatalf("no server span in %s", tracingtest.Names(spans))
			}
			get, ok := byName["driver.Get"]
			if !ok {
				t.Fatalf("no driver span in %s", tracingtest.Names(spans))
			}
			if server.ParentSpanID != parentSpan || get.ParentSpanID != server.SpanID {
				t.Errorf("parents: server %s (want %s), driver %s (want %s)", server.ParentSpanID, parentSpan, get.ParentSpanID, server.SpanID)
			}
			if get.Attrs["sandboxd.error.code"] != "NOT_FOUND" || !get.Error {
				t.Errorf("driver span: attrs %v error %v, want NOT_FOUND", get.Attrs, get.Error)
			}
			for k, want := range map[string]string{"service.name": "sandboxd-test", "service.version": "v9.9.9"} {
				if got := server.Resource[k]; got != want {
					t.Errorf("resource %s = %q, want %q", k, got, want)
				}
			}
			if server.Resource["host.name"] == "" {
				t.Error("resource has no host.name")
			}
			if bad := recv.Bad(); len(bad) > 0 {
				t.Errorf("the collector refused: %v", bad)
			}
		})
	}
}

// A collector that is down costs the server nothing but dropped spans: requests are served,
// shutdown is bounded.
func TestSetupCollectorDown(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	url := dead.URL
	dead.Close()
	t.Cleanup(tracing.Uninstall)
	c := tracing.DefaultConfig()
	c.Endpoint = url
	stop, err := tracing.Setup(t.Context(), c, tracing.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, end := tracing.StartServer(httptest.NewRequest(http.MethodGet, "/graphql", nil))
	end("/graphql", 200)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_ = stop(ctx) // an error: the spans could not be sent
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("shutdown took %s with the collector down, want at most its context's 2 s", d)
	}
}
