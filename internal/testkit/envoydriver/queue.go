package envoydriver

import (
	"io"
	"sync"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// sendQueue is the driver's side of a stream's outgoing messages: one
// goroutine calls Send and CloseSend (gRPC forbids concurrent use), and
// pushes never block, as Envoy's dispatcher never waits for the side stream.
type sendQueue struct {
	mu        sync.Mutex
	items     []*extprocv3.ProcessingRequest
	halfClose bool
	stopped   bool
	wake      chan struct{}
	done      chan struct{}
}

func newSendQueue(stream extprocv3.ExternalProcessor_ProcessClient) *sendQueue {
	q := &sendQueue{wake: make(chan struct{}, 1), done: make(chan struct{})}
	go q.run(stream)
	return q
}

// push queues m; it reports false once the stream is half-closed or failed.
func (q *sendQueue) push(m *extprocv3.ProcessingRequest) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.halfClose || q.stopped {
		return false
	}
	q.items = append(q.items, m)
	q.signal()
	return true
}

// closeSend half-closes the stream after what is queued.
func (q *sendQueue) closeSend() {
	q.mu.Lock()
	q.halfClose = true
	q.signal()
	q.mu.Unlock()
}

// stop discards what is queued and ends the goroutine.
func (q *sendQueue) stop() {
	q.mu.Lock()
	q.stopped = true
	q.items = nil
	q.signal()
	q.mu.Unlock()
	<-q.done
}

func (q *sendQueue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *sendQueue) run(stream extprocv3.ExternalProcessor_ProcessClient) {
	defer close(q.done)
	for {
		q.mu.Lock()
		for len(q.items) == 0 && !q.halfClose && !q.stopped {
			q.mu.Unlock()
			<-q.wake
			q.mu.Lock()
		}
		if q.stopped {
			q.mu.Unlock()
			return
		}
		if len(q.items) == 0 { // half-close after everything queued
			q.mu.Unlock()
			stream.CloseSend()
			return
		}
		m := q.items[0]
		q.items = q.items[1:]
		q.mu.Unlock()
		if err := stream.Send(m); err != nil {
			q.mu.Lock()
			q.stopped, q.items = true, nil
			q.mu.Unlock()
			return
		}
	}
}

// chunkReader is an io.Reader fed chunk by chunk without blocking the
// feeder: the body of a continued request.
type chunkReader struct {
	mu     sync.Mutex
	cond   *sync.Cond
	chunks [][]byte
	eof    bool
	err    error
}

func newChunkReader() *chunkReader {
	c := &chunkReader{}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func (c *chunkReader) push(b []byte) {
	c.mu.Lock()
	if !c.eof {
		c.chunks = append(c.chunks, b)
	}
	c.mu.Unlock()
	c.cond.Broadcast()
}

// end ends the body; err nil means complete.
func (c *chunkReader) end(err error) {
	c.mu.Lock()
	if !c.eof {
		c.eof, c.err = true, err
	}
	c.mu.Unlock()
	c.cond.Broadcast()
}

// Read implements io.Reader.
func (c *chunkReader) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		for len(c.chunks) > 0 && len(c.chunks[0]) == 0 {
			c.chunks = c.chunks[1:]
		}
		if len(c.chunks) > 0 {
			n := copy(p, c.chunks[0])
			c.chunks[0] = c.chunks[0][n:]
			return n, nil
		}
		if c.eof {
			if c.err != nil {
				return 0, c.err
			}
			return 0, io.EOF
		}
		c.cond.Wait()
	}
}

// Close stops the reader: pending and future chunks are dropped.
func (c *chunkReader) Close() error {
	c.end(io.ErrClosedPipe)
	return nil
}
