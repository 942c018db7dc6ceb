package envoyfilter

import (
	"context"
	"io"
	"sync"
)

// bodyPipe carries request_body chunks from a stream's receive loop to the
// handler that reads the request body. The receive loop never waits for
// the handler for long: the pipe holds up to pipeDepth chunks, and once the
// handler has stopped reading (it finished, or it forwards the body to an
// upstream that is gone) further chunks are dropped. Envoy keeps sending the
// rest of the body after the answer has started; those chunks land here and
// are discarded, never answered.
type bodyPipe struct {
	chunks   chan []byte
	readDone chan struct{} // closed by Close: nobody reads any more
	once     sync.Once

	// Owned by the writer (the receive loop).
	closed bool
	// err is what Read returns after the last chunk; set before chunks is
	// closed, read after.
	err error

	// Owned by the reader.
	cur []byte
}

// pipeDepth bounds the chunks in flight per stream (with Envoy's chunk
// sizes, a few MiB at worst).
const pipeDepth = 32

func newBodyPipe() *bodyPipe {
	return &bodyPipe{chunks: make(chan []byte, pipeDepth), readDone: make(chan struct{})}
}

// write hands a chunk to the reader. It waits while the pipe is full,
// unless the reader has gone or ctx ends. It reports whether the chunk was
// taken.
func (p *bodyPipe) write(ctx context.Context, chunk []byte) bool {
	if p.closed || len(chunk) == 0 {
		return false
	}
	select {
	case p.chunks <- chunk:
		return true
	case <-p.readDone:
		return false
	case <-ctx.Done():
		return false
	}
}

// finish ends the body: err nil means complete (end_of_stream or
// trailers), otherwise the reader gets err after the chunks it has not
// read yet. Only the first call counts.
func (p *bodyPipe) finish(err error) {
	if p.closed {
		return
	}
	p.closed = true
	if err == nil {
		err = io.EOF
	}
	p.err = err
	close(p.chunks)
}

// Read implements io.Reader for the handler.
func (p *bodyPipe) Read(b []byte) (int, error) {
	for len(p.cur) == 0 {
		chunk, ok := <-p.chunks
		if !ok {
			return 0, p.err
		}
		p.cur = chunk
	}
	n := copy(b, p.cur)
	p.cur = p.cur[n:]
	return n, nil
}

// Close tells the writer that nobody will read any more.
func (p *bodyPipe) Close() error {
	p.once.Do(func() { close(p.readDone) })
	return nil
}
