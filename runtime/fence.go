package runtime

import (
	"context"
	"fmt"
)

// Fences. The domain changes a box only while it holds the sandbox's operation lock
// (internal/store), and every lock hands out a fence: a number larger than that of every
// earlier holder of the same sandbox's lock. The holder passes it to the driver in the
// context of each write (WithFence). A driver keeps the highest fence each box has seen, with
// the box's durable record, and refuses a write whose fence is lower (ErrFenced) before it
// changes anything. So a replica that paused past its lease (a GC pause, SIGSTOP, a slow disk)
// while another replica took the lock and acted cannot make one more write afterwards: the
// new holder's first write raised the box's fence above the old holder's.

type fenceKey struct{}

// WithFence returns ctx carrying fence for the driver writes made with it. A zero fence
// carries nothing (every real fence is positive).
func WithFence(ctx context.Context, fence uint64) context.Context {
	if fence == 0 {
		return ctx
	}
	return context.WithValue(ctx, fenceKey{}, fence)
}

// FenceFrom returns the fence ctx carries, and whether it carries one.
func FenceFrom(ctx context.Context) (uint64, bool) {
	n, ok := ctx.Value(fenceKey{}).(uint64)
	return n, ok
}

// AdmitFence decides a write made with ctx to a box whose highest fence so far is seen (0:
// none). It returns the fence the box keeps once the write is done and whether that is a new
// one to store with it; an error wrapping ErrFenced when ctx's fence is lower than seen. A
// write whose ctx carries no fence is admitted and leaves seen as it is. Drivers call it under
// the same serialisation (a mutex, a resourceVersion) as the write's own change of the record.
func AdmitFence(ctx context.Context, seen uint64) (next uint64, raised bool, err error) {
	n, ok := FenceFrom(ctx)
	switch {
	case !ok || n == seen:
		return seen, false, nil
	case n < seen:
		return seen, false, fmt.Errorf("the write's fence %d is lower than %d, which the box has seen: %w", n, seen, ErrFenced)
	}
	return n, true, nil
}
