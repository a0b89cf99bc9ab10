package client

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"sandboxd/guest/proto"
)

// StreamDialer opens a new attach stream to the same guest init, its handshake done.
type StreamDialer func(ctx context.Context) (io.ReadWriteCloser, error)

// UseExecStreams makes StartLog (and Run) start commands over exec streams (proto/stream.go)
// that dial opens: one stream per command in flight, kept for the next command once a
// command's log was read to its end. A call never waits for a dial: when no stream is ready it
// goes over HTTP/2 while one is opened in the background. Give it only a dialer that costs a
// local connect, since each stream is an attach of its own. It reports false, and does
// nothing, when the init Dial checked does not serve exec streams. Close closes them all.
func (c *Client) UseExecStreams(dial StreamDialer) bool {
	if !c.execStreams {
		return false
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.streams = &streamPool{dial: dial, ctx: ctx, cancel: cancel, active: map[*execStream]struct{}{}}
	return true
}

// Stream pool limits.
const (
	// maxIdleStreams is how many idle streams a client keeps.
	maxIdleStreams = 4
	// maxStreams bounds a client's streams, idle or busy: a command that runs for hours holds
	// its stream (a connection at each end) all along, so past this many commands in flight
	// the others go over HTTP/2's one connection.
	maxStreams = 8
	// streamKeep is how long an idle stream is kept: long enough for an agent's think time
	// between two commands, and well within the init's proto.StreamIdle, so that a kept stream
	// is never one the init closed for idleness.
	streamKeep = 90 * time.Second
	// streamDialTimeout bounds a dial; streamDialBackoff is how long after a failed one the
	// pool dials again.
	streamDialTimeout = 30 * time.Second
	streamDialBackoff = time.Second
)

// streamPool is a client's exec streams: idle ones, newest last, and those carrying a call.
type streamPool struct {
	dial   StreamDialer
	ctx    context.Context // cancelled by close: ends a dial in flight
	cancel context.CancelFunc

	mu      sync.Mutex
	idle    []*execStream
	active  map[*execStream]struct{}
	dialing bool
	failed  time.Time // when the last dial failed
	closed  bool
}

// execStream is one exec stream and the reader of its answers, kept with it across calls.
type execStream struct {
	rwc  io.ReadWriteCloser
	br   *bufio.Reader
	used time.Time
}

// take returns the newest idle stream, or nil when none is.
func (p *streamPool) take() *execStream {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.idle) > 0 && !p.closed {
		st := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if time.Since(st.used) < streamKeep {
			p.active[st] = struct{}{}
			return st
		}
		go st.rwc.Close()
	}
	return nil
}

// fill opens a stream in the background for a later call, unless one is being opened or the
// last dial failed within streamDialBackoff.
func (p *streamPool) fill() {
	p.mu.Lock()
	if p.closed || p.dialing || time.Since(p.failed) < streamDialBackoff || len(p.idle)+len(p.active) >= maxStreams {
		p.mu.Unlock()
		return
	}
	p.dialing = true
	p.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(p.ctx, streamDialTimeout)
		defer cancel()
		st, err := p.open(ctx)
		p.mu.Lock()
		p.dialing = false
		if err != nil {
			p.failed = time.Now()
		} else {
			p.active[st] = struct{}{}
		}
		p.mu.Unlock()
		if err == nil {
			p.put(st, true)
		}
	}()
}

// open dials a stream and says hello.
func (p *streamPool) open(ctx context.Context) (*execStream, error) {
	rwc, err := p.dial(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := io.WriteString(rwc, proto.StreamHello); err != nil {
		rwc.Close()
		return nil, err
	}
	return &execStream{rwc: rwc, br: bufio.NewReaderSize(rwc, 64<<10)}, nil
}

// put ends a call on st: kept for the next one when whole, else closed.
func (p *streamPool) put(st *execStream, whole bool) {
	p.mu.Lock()
	delete(p.active, st)
	if !whole || p.closed {
		p.mu.Unlock()
		st.rwc.Close()
		return
	}
	st.used = time.Now()
	p.idle = append(p.idle, st)
	var drop *execStream
	if len(p.idle) > maxIdleStreams {
		drop = p.idle[0]
		p.idle = p.idle[1:]
	}
	p.mu.Unlock()
	if drop != nil {
		drop.rwc.Close()
	}
	time.AfterFunc(streamKeep, func() { p.expire(st) })
}

// expire closes st if it is still idle and was not used since it was put back streamKeep ago.
func (p *streamPool) expire(st *execStream) {
	p.mu.Lock()
	for i, s := range p.idle {
		if s == st && time.Since(st.used) >= streamKeep {
			p.idle = append(p.idle[:i], p.idle[i+1:]...)
			p.mu.Unlock()
			st.rwc.Close()
			return
		}
	}
	p.mu.Unlock()
}

// close closes every stream, idle or carrying a call (whose reader then fails with ErrClosed),
// and ends a dial in flight.
func (p *streamPool) close() {
	p.mu.Lock()
	p.closed = true
	all := p.idle
	p.idle = nil
	for st := range p.active {
		all = append(all, st)
	}
	p.mu.Unlock()
	p.cancel()
	for _, st := range all {
		st.rwc.Close()
	}
}

// startLogStream is StartLog over st. A kept stream may have been closed by the init (a pause
// that did not happen, say) without this end noticing yet: when it breaks before any answer,
// the call is made again over HTTP/2, and a command that did start over st is followed from
// its log.
func (c *Client) startLogStream(ctx context.Context, st *execStream, req proto.ExecRequest) (*LogReader, error) {
	body, err := json.Marshal(req)
	if err != nil {
		c.streams.put(st, true)
		return nil, err
	}
	if len(body) > proto.MaxStreamRequest {
		c.streams.put(st, true)
		return nil, &proto.Error{Code: proto.ErrCodeTooLarge, Message: fmt.Sprintf("request body over %d bytes", proto.MaxStreamRequest)}
	}
	sctx, span := startCall(withExecID(ctx, req.ID), "POST", "/v1/execs")
	lr, err := c.callStream(sctx, st, req.ID, body)
	endCall(span, err)
	if err == nil || !errors.Is(err, ErrClosed) || ctx.Err() != nil {
		return lr, err
	}
	c.streams.fill() // for the next call, in place of the broken one
	lr, err = c.startLogHTTP(ctx, req)
	if pe := (*proto.Error)(nil); errors.As(err, &pe) && pe.Code == proto.ErrCodeExists {
		return c.Log(ctx, req.ID, 0, true)
	}
	return lr, err
}

// callStream sends one call (the start of exec id) on st and reads the answer's opening; a
// started command's log follows on st. The write and the answer's opening are bounded by
// startAnswerTimeout: past it the stream is closed and the call fails with ErrNoAnswer.
func (c *Client) callStream(ctx context.Context, st *execStream, id string, body []byte) (*LogReader, error) {
	stop := context.AfterFunc(ctx, func() { st.rwc.Close() })
	timer := time.AfterFunc(startAnswerTimeout, func() { st.rwc.Close() })
	failed := func(err error) error {
		stop()
		c.streams.put(st, false)
		if !timer.Stop() && ctx.Err() == nil {
			return noAnswer(id)
		}
		return streamErr(ctx, err)
	}
	msg := make([]byte, 4, 4+len(body))
	binary.BigEndian.PutUint32(msg, uint32(len(body)))
	if _, err := st.rwc.Write(append(msg, body...)); err != nil {
		return nil, failed(err)
	}
	var ans [proto.StreamAnswerLen]byte
	if _, err := io.ReadFull(st.br, ans[:]); err != nil {
		return nil, failed(err)
	}
	n := binary.BigEndian.Uint32(ans[1:])
	var refusal []byte
	if ans[0] == proto.StreamRefused && n <= proto.MaxStreamRefusal {
		refusal = make([]byte, n)
		if _, err := io.ReadFull(st.br, refusal); err != nil {
			return nil, failed(err)
		}
	}
	if !timer.Stop() {
		// The answer came as the timer closed the stream: what follows it is lost.
		return nil, failed(io.ErrUnexpectedEOF)
	}
	switch {
	case ans[0] == proto.StreamStarted && n == 0:
		sb := &streamBody{p: c.streams, st: st, stop: stop}
		return &LogReader{c: c, ctx: ctx, body: sb, br: st.br, stream: sb}, nil
	case refusal != nil:
		whole := stop() // false: ctx closed the stream meanwhile
		c.streams.put(st, whole)
		e := &proto.Error{}
		if json.Unmarshal(refusal, e) != nil || e.Code == "" {
			e = &proto.Error{Code: proto.ErrCodeInternal, Message: "the guest init refused a command with an unreadable error"}
		}
		return nil, e
	}
	stop()
	c.streams.put(st, false)
	return nil, fmt.Errorf("%w: the guest init answered an exec stream with %#x (%d bytes)", ErrClosed, ans[0], n)
}

// streamErr marks an exec stream's failure: the stream broke (ErrClosed), or ctx ended it.
func streamErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("guest: %w (%v)", ctx.Err(), err)
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%w: exec stream: %w", ErrClosed, err)
}

// streamBody is the log of a call on an exec stream, read through the stream's reader. Its
// Close keeps the stream for the next call once the exit record was read, else closes it.
type streamBody struct {
	p    *streamPool
	st   *execStream
	stop func() bool
	done atomic.Bool // the exit record was read
	once sync.Once
}

func (b *streamBody) Read(p []byte) (int, error) { return b.st.br.Read(p) }

func (b *streamBody) Close() error {
	b.once.Do(func() {
		whole := b.stop() && b.done.Load()
		b.p.put(b.st, whole)
	})
	return nil
}
