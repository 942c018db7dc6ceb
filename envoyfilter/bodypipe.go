package envoyfilter

import (
	"io"
	"sync"
)

// bodyPipe carries request_body chunks from a stream's receive loop to the
// handler that reads the request body. It is bounded in bytes, not chunks:
// the receive goroutine takes the next message from gRPC only while the
// pipe holds less than pipeLimit bytes (waitRoom), so a client that sends
// faster than the upstream reads is held back by gRPC flow control and the
// pipe holds at most pipeLimit plus one message. Once the handler has
// stopped reading (it finished, or it forwards the body to an upstream that
// is gone) chunks are dropped: Envoy keeps sending the rest of the body
// after the answer has started, and those chunks are discarded, never
// answered.
type bodyPipe struct {
	mu         sync.Mutex
	chunks     [][]byte // written, not yet taken by the reader
	buffered   int      // bytes held: chunks plus the reader's current chunk
	finished   bool     // finish was called; err is what Read returns at the end
	err        error
	readerGone bool          // Close was called
	readable   chan struct{} // a chunk or the end arrived (capacity 1)
	room       chan struct{} // bytes were freed (capacity 1)

	// Owned by the reader: the chunk being read and its full length.
	cur    []byte
	curLen int
}

// pipeLimit is how many bytes a pipe holds before the receive goroutine
// stops taking messages: four of the 64 KiB chunks Envoy sends at most with
// its default buffer limits, so a hedged request streams its body without
// waiting on every chunk.
const pipeLimit = 256 << 10

func newBodyPipe() *bodyPipe {
	return &bodyPipe{readable: make(chan struct{}, 1), room: make(chan struct{}, 1)}
}

// signal wakes the goroutine waiting on ch, if any, without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// write hands a chunk to the reader without waiting: the bound is kept by
// the receive goroutine (waitRoom), before it takes the message. It reports
// whether the chunk was taken (false once the body ended or nobody reads).
func (p *bodyPipe) write(chunk []byte) bool {
	if len(chunk) == 0 {
		return false
	}
	p.mu.Lock()
	if p.finished || p.readerGone {
		p.mu.Unlock()
		return false
	}
	p.chunks = append(p.chunks, chunk)
	p.buffered += len(chunk)
	p.mu.Unlock()
	signal(p.readable)
	return true
}

// waitRoom returns once the pipe holds less than pipeLimit bytes, the body
// ended, the reader has gone, or stop is closed.
func (p *bodyPipe) waitRoom(stop <-chan struct{}) {
	for !p.hasRoom() {
		select {
		case <-p.room:
		case <-stop:
			return
		}
	}
}

// hasRoom reports whether the receive goroutine may take another message.
func (p *bodyPipe) hasRoom() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.buffered < pipeLimit || p.finished || p.readerGone
}

// finish ends the body: err nil means complete (end_of_stream or
// trailers), otherwise the reader gets err after the chunks it has not
// read yet. Only the first call counts.
func (p *bodyPipe) finish(err error) {
	p.mu.Lock()
	if p.finished {
		p.mu.Unlock()
		return
	}
	if err == nil {
		err = io.EOF
	}
	p.finished, p.err = true, err
	p.mu.Unlock()
	signal(p.readable)
	// A receive goroutine waiting for room may go on: nothing more is kept.
	signal(p.room)
}

// Read implements io.Reader for the handler.
func (p *bodyPipe) Read(b []byte) (int, error) {
	for len(p.cur) == 0 {
		p.mu.Lock()
		switch {
		case len(p.chunks) > 0:
			p.cur, p.curLen = p.chunks[0], len(p.chunks[0])
			p.chunks[0] = nil
			p.chunks = p.chunks[1:]
			p.mu.Unlock()
		case p.finished:
			err := p.err
			p.mu.Unlock()
			return 0, err
		case p.readerGone:
			p.mu.Unlock()
			return 0, io.ErrClosedPipe
		default:
			p.mu.Unlock()
			<-p.readable
		}
	}
	n := copy(b, p.cur)
	p.cur = p.cur[n:]
	if len(p.cur) == 0 {
		// The chunk is consumed: its memory is no longer held here. Until
		// then the reader keeps the whole chunk alive, so it counts whole.
		p.cur = nil
		p.mu.Lock()
		p.buffered -= p.curLen
		p.mu.Unlock()
		signal(p.room)
	}
	return n, nil
}

// Close tells the writer that nobody will read any more; the chunks still
// held are released.
func (p *bodyPipe) Close() error {
	p.mu.Lock()
	p.readerGone = true
	p.chunks, p.buffered = nil, 0
	p.mu.Unlock()
	signal(p.room)
	signal(p.readable) // a Read still waiting returns
	return nil
}
