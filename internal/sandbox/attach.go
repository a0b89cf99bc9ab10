package sandbox

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/internal/apierror"
	"sandboxd/runtime"
)

// attachments is this replica's cache of attach streams, one per sandbox it serves, and what a
// failed guest call on one of them means.
type attachments struct {
	driver runtime.Driver
	// observe records a box that died RUNNING as FAILED (Service.Observe).
	observe func(ctx context.Context, box runtime.Box) runtime.Record

	mu sync.Mutex
	m  map[string]*attachment
}

func newAttachments(d runtime.Driver, observe func(context.Context, runtime.Box) runtime.Record) *attachments {
	return &attachments{driver: d, observe: observe, m: map[string]*attachment{}}
}

// attachment is this replica's attach stream to one sandbox's guest init, shared by every call.
type attachment struct {
	ready  chan struct{}
	client *client.Client
	err    error
}

func (a *attachment) close() {
	<-a.ready
	if a.client != nil {
		a.client.Close()
	}
}

// Guest returns a client on the sandbox's guest init, attaching once per sandbox and replica.
func (s *Service) Guest(ctx context.Context, id string) (*client.Client, error) {
	return s.attachs.get(ctx, id)
}

// GuestError turns a failed guest call into a client error: a broken attach to a dead box
// marks the sandbox FAILED; a guest's own error keeps its meaning.
func (s *Service) GuestError(ctx context.Context, id string, err error) error {
	return s.attachs.guestError(ctx, id, err)
}

// get returns a client on the sandbox's guest init, attaching once.
func (c *attachments) get(ctx context.Context, id string) (*client.Client, error) {
	for {
		c.mu.Lock()
		a, ok := c.m[id]
		if !ok {
			a = &attachment{ready: make(chan struct{})}
			c.m[id] = a
			c.mu.Unlock()
			a.client, a.err = c.attach(ctx, id)
			close(a.ready)
			if a.err != nil {
				c.mu.Lock()
				if c.m[id] == a {
					delete(c.m, id)
				}
				c.mu.Unlock()
				return nil, a.err
			}
			return a.client, nil
		}
		c.mu.Unlock()
		select {
		case <-a.ready:
		case <-ctx.Done():
			return nil, apierror.Wrap(ctx.Err(), apierror.Unavailable, "the request was cancelled")
		}
		if a.err != nil {
			return nil, a.err
		}
		if a.broken() {
			// The stream broke: forget it (closing what is left of it) and attach again.
			c.dropBroken(id)
			continue
		}
		return a.client, nil
	}
}

func (c *attachments) attach(ctx context.Context, id string) (*client.Client, error) {
	// The attach outlives the request that opened it.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	rwc, err := c.driver.Attach(actx, id)
	if err != nil {
		if errors.Is(err, runtime.ErrNotRunning) {
			box, gerr := c.driver.Get(actx, id)
			if gerr == nil && State(box.Record.State).KeepsProcesses() {
				return nil, apierror.Wrap(err, apierror.InvalidState, "sandbox %s is %s", id, box.Record.State).
					WithDetail("state", box.Record.State).WithRetryAfter(busyRetryAfter)
			}
			if gerr == nil && box.Phase == runtime.PhaseFailed {
				rec := c.observe(actx, box)
				return nil, apierror.Wrap(err, apierror.SandboxFailed, "the sandbox failed: %s", rec.StateReason)
			}
		}
		return nil, apierror.Wrap(err, apierror.Unavailable, "could not attach to the sandbox").WithRetryAfter(time.Second)
	}
	// The attach's handshake proved the init; its health call is asked only where its answer
	// decides something: whether the init serves exec streams, which only a driver that attaches
	// locally opens. Elsewhere (Kubernetes, where each round trip crosses the API server) the
	// first call goes out with the stream's HTTP/2 preface, and a stream that broke since fails
	// that call, which GuestError then reads as for any broken attach.
	la, local := runtime.Capability[runtime.LocalAttacher](c.driver)
	var cl *client.Client
	if local {
		cl, err = client.Dial(rwc)
	} else {
		cl, err = client.DialUnchecked(actx, rwc)
	}
	if err != nil {
		rwc.Close()
		return nil, apierror.Wrap(err, apierror.Unavailable, "the sandbox's init does not answer").WithRetryAfter(time.Second)
	}
	if local {
		cl.UseExecStreams(func(ctx context.Context) (io.ReadWriteCloser, error) { return la.AttachStream(ctx, id) })
	}
	return cl, nil
}

// drop forgets the sandbox's attach stream and closes it in the background.
func (c *attachments) drop(id string) {
	c.mu.Lock()
	a, ok := c.m[id]
	delete(c.m, id)
	c.mu.Unlock()
	if ok {
		go a.close()
	}
}

// forPause ends this replica's attach to the sandbox for its pause. When the attach is whole,
// the returned context lets the driver quiesce the guest init over it (runtime.WithQuiesce),
// which ends it; end, called once the driver's Pause returned, ends it otherwise.
func (c *attachments) forPause(ctx context.Context, id string) (pctx context.Context, end func()) {
	a := c.take(id)
	if a == nil {
		return ctx, func() {}
	}
	var once sync.Once
	end = func() { once.Do(a.close) }
	return runtime.WithQuiesce(ctx, func(qctx context.Context) error {
		defer end()
		_, err := a.client.Quiesce(qctx)
		return err
	}), end
}

// take forgets the sandbox's attach stream and returns it when it is ready and whole; else it
// drops it as drop does and returns nil. The caller closes what it took.
func (c *attachments) take(id string) *attachment {
	c.mu.Lock()
	a, ok := c.m[id]
	delete(c.m, id)
	c.mu.Unlock()
	if !ok {
		return nil
	}
	select {
	case <-a.ready:
		if a.client != nil && !a.broken() {
			return a
		}
	default:
	}
	go a.close()
	return nil
}

// dropBroken forgets the sandbox's attach stream when it broke. A failed call does not say
// which stream it went over: the cached one may already be a newer attach that another
// caller made after the break, with calls in flight (an exec's retry of its start), and
// closing that one would fail them too.
func (c *attachments) dropBroken(id string) {
	c.mu.Lock()
	a, ok := c.m[id]
	ok = ok && a.broken()
	if ok {
		delete(c.m, id)
	}
	c.mu.Unlock()
	if ok {
		go a.close()
	}
}

// broken reports whether the attach was made and its stream has broken since (not while it
// is still being made: that is a new stream).
func (a *attachment) broken() bool {
	select {
	case <-a.ready:
	default:
		return false
	}
	if a.client == nil {
		return false
	}
	select {
	case <-a.client.Done():
		return true
	default:
		return false
	}
}

// closeAll closes every attach stream.
func (c *attachments) closeAll() {
	c.mu.Lock()
	as := c.m
	c.m = map[string]*attachment{}
	c.mu.Unlock()
	for _, a := range as {
		a.close()
	}
}

func (c *attachments) guestError(ctx context.Context, id string, err error) error {
	var ge *proto.Error
	if errors.As(err, &ge) {
		switch ge.Code {
		case proto.ErrCodeNotFound:
			return apierror.Wrap(err, apierror.NotFound, "%s", ge.Message)
		case proto.ErrCodeInvalid, proto.ErrCodeIsDir, proto.ErrCodeNotDir:
			return apierror.Wrap(err, apierror.InvalidArgument, "%s", ge.Message)
		case proto.ErrCodeTooLarge, proto.ErrCodeNoSpace:
			return apierror.Wrap(err, apierror.PayloadTooLarge, "%s", ge.Message)
		case proto.ErrCodeExists:
			return apierror.Wrap(err, apierror.AlreadyExists, "%s", ge.Message)
		case proto.ErrCodeState:
			return apierror.Wrap(err, apierror.InvalidState, "%s", ge.Message)
		case proto.ErrCodeUnavailable:
			return apierror.Wrap(err, apierror.Unavailable, "%s", ge.Message).WithRetryAfter(time.Second)
		case proto.ErrCodeTooMany:
			return apierror.Wrap(err, apierror.LimitExceeded, "%s", ge.Message).
				WithDetail("limit_name", "running_execs_per_sandbox").WithRetryAfter(time.Second)
		}
		return apierror.Wrap(err, apierror.Internal, "internal error")
	}
	if ctx.Err() != nil {
		return apierror.Wrap(err, apierror.Unavailable, "the request was cancelled")
	}
	c.dropBroken(id)
	box, gerr := c.driver.Get(context.WithoutCancel(ctx), id)
	if gerr == nil && State(box.Record.State).KeepsProcesses() {
		// A pause broke the stream: the sandbox did not fail, its processes are kept.
		return apierror.Wrap(err, apierror.InvalidState, "sandbox %s is %s: the call was cut by its pause", id, box.Record.State).
			WithDetail("state", box.Record.State).WithRetryAfter(busyRetryAfter)
	}
	if gerr == nil && box.Phase == runtime.PhaseFailed {
		rec := c.observe(context.WithoutCancel(ctx), box)
		return apierror.Wrap(err, apierror.SandboxFailed, "the sandbox failed: %s", rec.StateReason).WithDetail("state", rec.State)
	}
	return apierror.Wrap(err, apierror.Unavailable, "lost the connection to the sandbox; retry").WithRetryAfter(time.Second)
}
