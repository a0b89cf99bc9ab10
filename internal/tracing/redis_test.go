package tracing_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"sandboxd/internal/quota"
	"sandboxd/internal/redistest"
	"sandboxd/internal/tracing"
	"sandboxd/internal/tracing/tracingtest"
)

// runScript runs a script from this test's own function, as our packages do.
func runScript(ctx context.Context, rdb redis.UniversalClient, s *redis.Script, keys ...string) error {
	return s.Run(ctx, rdb, keys, "arg-secret").Err()
}

// A script run inside a trace is a span named after our function that ran it, with no keys
// or arguments; other commands, and scripts outside a trace, are no spans.
func TestRedisScriptSpans(t *testing.T) {
	rs := redistest.Start(t) // a real redis-server: NOSCRIPT, error replies and all
	tracing.Redis(rs.Client)
	rec := tracingtest.Record(t)
	ctx, parent := otel.Tracer("test").Start(t.Context(), "parent")

	ok := redis.NewScript(`return redis.call('SET', KEYS[1], ARGV[1])`)
	nilReply := redis.NewScript(`return redis.call('GET', KEYS[1])`)
	oom := redis.NewScript(`return redis.error_reply('OOM command not allowed for tenant-secret')`)
	lower := redis.NewScript(`return redis.error_reply('boom tenant-secret')`)
	if err := runScript(ctx, rs.Client, ok, "{tenant-secret:proj}:k"); err != nil {
		t.Fatal(err)
	}
	if err := runScript(ctx, rs.Client, nilReply, "{tenant-secret:proj}:missing"); err != redis.Nil {
		t.Fatalf("got %v, want redis.Nil", err)
	}
	if err := runScript(ctx, rs.Client, oom, "k"); err == nil {
		t.Fatal("the failing script did not fail")
	}
	if err := runScript(ctx, rs.Client, lower, "k"); err == nil {
		t.Fatal("the failing script did not fail")
	}
	if err := rs.Client.Set(ctx, "plain", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	parent.End()
	n := len(rec.Ended())
	if err := runScript(context.Background(), rs.Client, ok, "k2"); err != nil {
		t.Fatal(err)
	}
	if got := len(rec.Ended()); got != n {
		t.Errorf("a script outside a trace made %d spans, want 0", got-n)
	}

	const name = "redis tracing_test.runScript"
	var got []string
	for _, s := range rec.Ended() {
		if s.Name() == "parent" {
			continue
		}
		code, _ := attr(s, "sandboxd.error.code")
		op, _ := attr(s, "db.operation.name")
		got = append(got, op+":"+code+":"+s.Status().Description)
		if s.Name() != name {
			t.Errorf("span %q, want %q", s.Name(), name)
		}
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("%s: not a child of the caller's span", s.Name())
		}
		if fn, _ := attr(s, "code.function.name"); fn != "sandboxd/internal/tracing_test.runScript" {
			t.Errorf("code.function.name %q", fn)
		}
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.Emit(), "secret") {
				t.Errorf("%s: attribute %s = %q carries a key, an argument or an error message", s.Name(), kv.Key, kv.Value.Emit())
			}
		}
	}
	// Each script's first run: EVALSHA answers NOSCRIPT (not a failure), go-redis sends EVAL.
	want := []string{"EVALSHA:NOSCRIPT:", "EVAL::", "EVALSHA:NOSCRIPT:", "EVAL::",
		"EVALSHA:NOSCRIPT:", "EVAL:OOM:OOM", "EVALSHA:NOSCRIPT:", "EVAL:REDIS_ERROR:REDIS_ERROR"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("script spans (op:code:status)\n got %q\nwant %q", got, want)
	}
	for _, s := range rec.Ended() {
		failed := s.Status().Code == codes.Error
		if code, _ := attr(s, "sandboxd.error.code"); failed != (code != "" && code != "NOSCRIPT") {
			t.Errorf("%s with code %q: failed %v", s.Name(), code, failed)
		}
	}
}

// Through one of our packages: the span names the function that ran the script.
func TestRedisScriptSpanNamesOurFunction(t *testing.T) {
	rs := redistest.Embedded(t)
	tracing.Redis(rs.Client)
	q := quota.New(rs.Client, func(context.Context, string, string) ([]string, error) { return nil, nil },
		quota.Options{Limits: quota.Limits{Default: 5}, Lease: time.Minute})
	rec := tracingtest.Record(t)
	ctx, parent := otel.Tracer("test").Start(t.Context(), "parent")
	if _, err := q.Acquire(ctx, "tenant-secret", "proj", "sbx_1"); err != nil {
		t.Fatal(err)
	}
	parent.End()
	if !hasSpan(rec.Ended(), "redis quota.(*Quota).Acquire") {
		t.Errorf("spans %s, want redis quota.(*Quota).Acquire", spanNames(rec.Ended()))
	}
}

func hasSpan(spans []sdktrace.ReadOnlySpan, name string) bool {
	for _, s := range spans {
		if s.Name() == name {
			return true
		}
	}
	return false
}
