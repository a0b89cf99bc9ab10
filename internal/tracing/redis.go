package tracing

import (
	"context"
	"errors"
	goruntime "runtime"
	"strings"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Redis adds the script spans to each client (go-redis hooks): every EVAL, EVALSHA or FCALL
// made inside a trace is a span named after the function of ours that ran the script
// ("redis quota.(*Quota).Acquire"), so that a trace shows which script cost what. Other
// commands, and scripts run outside any trace (the exec followers' appends, background
// sweeps), get no span. Keys and arguments are never recorded: they name tenants.
func Redis(clients ...redis.UniversalClient) {
	for _, c := range clients {
		c.AddHook(redisHook{})
	}
}

type redisHook struct{}

func (redisHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (redisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !isScript(cmd.Name()) {
			return next(ctx, cmd)
		}
		ctx, span := startScript(ctx, cmd.Name(), 1)
		err := next(ctx, cmd)
		endScript(span, err)
		return err
	}
}

func (redisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		scripts := 0
		for _, c := range cmds {
			if isScript(c.Name()) {
				scripts++
			}
		}
		if scripts == 0 {
			return next(ctx, cmds)
		}
		ctx, span := startScript(ctx, "pipeline", scripts)
		err := next(ctx, cmds)
		if err == nil {
			for _, c := range cmds {
				if isScript(c.Name()) && c.Err() != nil {
					err = c.Err()
					break
				}
			}
		}
		endScript(span, err)
		return err
	}
}

// isScript reports whether a command (go-redis's lower-case name) runs a script.
func isScript(name string) bool {
	switch name {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
		return true
	}
	return false
}

func startScript(ctx context.Context, op string, n int) (context.Context, trace.Span) {
	op = strings.ToUpper(op)
	attrs := []attribute.KeyValue{semconv.DBSystemNameRedis, semconv.DBOperationName(op)}
	if n > 1 {
		attrs = append(attrs, semconv.DBOperationBatchSize(n))
	}
	ctx, span := startChild(ctx, "sandboxd/redis", "redis "+op, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	if span.IsRecording() {
		if fn := scriptCaller(); fn != "" {
			span.SetName("redis " + strings.TrimPrefix(fn, "sandboxd/internal/"))
			span.SetAttributes(semconv.CodeFunctionName(fn))
		}
	}
	return ctx, span
}

// endScript ends a script's span: a missing value (redis.Nil) is an answer, NOSCRIPT the
// first run of a script on this server (go-redis sends it again whole), anything else a
// failure with the error's Redis prefix ("OOM", "BUSY") or the network's code.
func endScript(span trace.Span, err error) {
	switch {
	case err == nil || errors.Is(err, redis.Nil):
	case redis.HasErrorPrefix(err, "NOSCRIPT"):
		span.SetAttributes(KeyErrorCode.String("NOSCRIPT"))
	default:
		Fail(span, redisCode(err))
	}
	span.End()
}

// redisCode is the first word of a Redis error when it is a Redis error prefix (upper-case
// letters), REDIS_ERROR for another Redis error, else the error's own code.
func redisCode(err error) string {
	var re redis.Error
	if !errors.As(err, &re) {
		return CodeOf(err)
	}
	word, _, _ := strings.Cut(re.Error(), " ")
	if word == "" || len(word) > 16 || strings.ContainsFunc(word, func(r rune) bool { return r < 'A' || r > 'Z' }) {
		return "REDIS_ERROR"
	}
	return word
}

// scriptCaller is the function of this module that ran the script: the first frame of the
// stack under sandboxd/ but outside this package ("sandboxd/internal/quota.(*Quota).Acquire",
// also for a closure inside it).
// Only for recorded spans: walking the stack costs about a microsecond.
func scriptCaller() string {
	var pcs [32]uintptr
	n := goruntime.Callers(3, pcs[:])
	frames := goruntime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if strings.HasPrefix(f.Function, "sandboxd/") && !strings.HasPrefix(f.Function, "sandboxd/internal/tracing.") {
			return enclosing(f.Function)
		}
		if !more {
			return ""
		}
	}
}

// enclosing is the function a closure is in: fn without its ".func1", ".func1.2" suffixes.
func enclosing(fn string) string {
	for {
		i := strings.LastIndexByte(fn, '.')
		if i < 0 || strings.LastIndexByte(fn, '/') > i {
			return fn
		}
		seg := strings.TrimPrefix(fn[i+1:], "func")
		if seg == "" || strings.ContainsFunc(seg, func(r rune) bool { return r < '0' || r > '9' }) {
			return fn
		}
		fn = fn[:i]
	}
}
