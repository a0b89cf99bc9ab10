package runtime

import "context"

// A pause first quiesces the box's guest init (it closes what runsc cannot save). The domain
// usually holds an attach to that init already: it passes a way to quiesce over it in the
// Pause call's context (WithQuiesce), and a driver whose pause quiesces the init may use it
// instead of opening a stream of its own, which costs a connection and a handshake more. The
// function ends the caller's attach whatever happens: a driver that falls back to its own
// stream after an error from it finds the attach gone.

type quiesceKey struct{}

// WithQuiesce returns ctx carrying fn, which quiesces the box's guest init over the caller's
// attach and returns the guest's answer (a *proto.Error when it refused).
func WithQuiesce(ctx context.Context, fn func(context.Context) error) context.Context {
	return context.WithValue(ctx, quiesceKey{}, fn)
}

// QuiesceFrom returns the quiesce function ctx carries, or nil.
func QuiesceFrom(ctx context.Context) func(context.Context) error {
	fn, _ := ctx.Value(quiesceKey{}).(func(context.Context) error)
	return fn
}
