package proto

import "time"

// The exec stream: a second protocol on an attach stream, for the one call every exec makes,
// start a command and follow its log to the end (POST /v1/execs?follow=1). Over HTTP/2 that
// call crosses a request's goroutines and frames at each end, a handful of thread wake-ups
// that cost the most inside a sandbox, where each is a host round trip. On a stream of its own
// the call is one write each way and the records as the log holds them.
//
// After the handshake the host's first bytes choose the protocol: the HTTP/2 client preface,
// or StreamHello. Then, any number of times, one call after the other:
//
//	host → init   length (uint32, big-endian, ≤ MaxStreamRequest) + ExecRequest (JSON)
//	init → host   StreamStarted + uint32 0, then the exec's log records from offset 0 up to
//	              and including its exit record (the format of GET /v1/execs/{id}/log)
//	          or  StreamRefused + uint32 length + Error (JSON): nothing was started
//
// The host sends its next call only after it read the exit record, so the stream carries one
// call at a time and needs no flow control of its own: a host that reads slowly holds the
// init's writer back through the socket. A stream the init cannot carry to the exit record
// (its log broke, it is shutting down, a pause closed its streams) is closed: the host sees a
// broken stream, never a clean end, and reads the rest with GET /v1/execs/{id}/log. A host that
// stops reading closes the stream; the command runs on. A stream waits at most StreamIdle for
// its next call.
const (
	StreamHello = "SBXS1"
	// StreamStarted and StreamRefused open the init's answer to a call.
	StreamStarted byte = 0x00
	StreamRefused byte = 0x01
	// StreamAnswerLen is the size of an answer's opening: its byte and a length.
	StreamAnswerLen = 5
	// MaxStreamRequest bounds a call's request (POST /v1/execs takes as much).
	MaxStreamRequest = 64 << 20
	// MaxStreamRefusal bounds a refusal's Error.
	MaxStreamRefusal = 64 << 10
	// StreamIdle is how long the init keeps a stream that waits for its next call.
	StreamIdle = 3 * time.Minute
)
