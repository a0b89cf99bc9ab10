package server

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"sandboxd/guest/proto"
)

// streamRequestTimeout bounds the read of a call's request once its length arrived.
const streamRequestTimeout = 30 * time.Second

// serveStream serves the exec stream (proto/stream.go) on c, whose reads go through br and
// whose StreamHello was read. It returns when the stream ends; the caller closes c. quiesces
// is s.quiesces when c came: a connection whose hello was still on its way when a pause's
// quiesce closed the streams is closed too (the pause saves no connection to the host).
func (s *Server) serveStream(c net.Conn, br *bufio.Reader, quiesces uint64) {
	s.mu.Lock()
	if s.quiesces != quiesces {
		s.mu.Unlock()
		return
	}
	s.streams[c] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.streams, c)
		s.mu.Unlock()
	}()
	var hdr [4]byte
	for {
		_ = c.SetReadDeadline(time.Now().Add(proto.StreamIdle))
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > proto.MaxStreamRequest {
			// The request is not read: the stream cannot go on past it.
			_ = refuse(c, errorf(proto.ErrCodeTooLarge, "request body over %d bytes", proto.MaxStreamRequest))
			return
		}
		_ = c.SetReadDeadline(time.Now().Add(streamRequestTimeout))
		body := make([]byte, n)
		if _, err := io.ReadFull(br, body); err != nil {
			return
		}
		if !s.serveCall(c, br, body) {
			return
		}
	}
}

// serveCall answers one call of an exec stream and reports whether the stream can carry the
// next one.
func (s *Server) serveCall(c net.Conn, br *bufio.Reader, body []byte) bool {
	if !s.enter() {
		_ = refuse(c, errShuttingDown())
		return false
	}
	defer s.handlers.Done()

	var req proto.ExecRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return refuse(c, errorf(proto.ErrCodeInvalid, "bad request body: %v", err)) == nil
	}
	info, perr := s.startExec(req)
	if perr != nil {
		return refuse(c, perr) == nil
	}
	e := s.lookup(info.ID)
	if e == nil {
		// Forgotten already (a DELETE of an exec that ended at once): its log is gone.
		return refuse(c, errorf(proto.ErrCodeNotFound, "exec %s ended and was forgotten before its log was read", info.ID)) == nil
	}
	if _, err := c.Write([]byte{proto.StreamStarted, 0, 0, 0, 0}); err != nil {
		return false
	}

	// The host sends nothing during a call: a read that fails meanwhile is the host gone (or
	// the stream closed by a pause or Close), and the copy stops. The watch peeks, so that a
	// next call that comes right after the exit record is left for the loop.
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	var stopping atomic.Bool
	watched := make(chan struct{})
	_ = c.SetReadDeadline(time.Time{})
	go func() {
		defer close(watched)
		if _, err := br.Peek(1); err != nil && !(stopping.Load() && errors.Is(err, os.ErrDeadlineExceeded)) {
			cancel()
		}
	}()
	err := e.log.copyTo(ctx, c, func() error { return nil }, 0, true)
	ok := err == nil && ctx.Err() == nil
	stopping.Store(true)
	_ = c.SetReadDeadline(time.Now())
	<-watched
	return ok
}

// refuse answers a call with StreamRefused and the error.
func refuse(c net.Conn, e *proto.Error) error {
	b, err := json.Marshal(e)
	if err != nil || len(b) > proto.MaxStreamRefusal {
		b, _ = json.Marshal(errorf(proto.ErrCodeInternal, "the refusal did not fit"))
	}
	msg := make([]byte, proto.StreamAnswerLen, proto.StreamAnswerLen+len(b))
	msg[0] = proto.StreamRefused
	binary.BigEndian.PutUint32(msg[1:], uint32(len(b)))
	_, err = c.Write(append(msg, b...))
	return err
}

// closeStreams closes every exec stream: a pause saves no connection to the host, and a call
// in flight is read on from its log after the resume.
func (s *Server) closeStreams() {
	s.mu.Lock()
	s.quiesces++
	conns := make([]net.Conn, 0, len(s.streams))
	for c := range s.streams {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}
