package envoyfilter

import (
	"context"
	"errors"
	"sync"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// errSendFailed is returned to writers once the stream cannot carry
// messages any more (Envoy reset it, or the server is stopping).
var errSendFailed = errors.New("llmhedge: ext_proc stream closed")

// sender is the one goroutine that calls stream.Send: gRPC forbids
// concurrent Sends on a stream, and the replies of a stream come from both
// its receive loop (pass-through answers) and its handler (the hedged
// answer). Messages go out in the order they were queued.
type sender struct {
	queue  chan *extprocv3.ProcessingResponse
	failed chan struct{} // closed when a Send failed; err says why
	done   chan struct{} // closed when the goroutine ends
	err    error
	once   sync.Once
}

// queueDepth lets a writer run a few messages ahead of gRPC flow control
// without letting a stalled Envoy make the server buffer a whole answer.
const queueDepth = 8

func newSender(stream extprocv3.ExternalProcessor_ProcessServer) *sender {
	s := &sender{queue: make(chan *extprocv3.ProcessingResponse, queueDepth),
		failed: make(chan struct{}), done: make(chan struct{})}
	go s.run(stream)
	return s
}

func (s *sender) run(stream extprocv3.ExternalProcessor_ProcessServer) {
	defer close(s.done)
	for msg := range s.queue {
		if err := stream.Send(msg); err != nil {
			s.err = err
			close(s.failed)
			// Discard the rest so that queued senders never block; new
			// sends see failed and return an error.
			for range s.queue {
			}
			return
		}
	}
}

// send queues msg. It blocks while the queue is full (gRPC flow control
// pushing back), and fails when the stream is gone or ctx ends.
func (s *sender) send(ctx context.Context, msg *extprocv3.ProcessingResponse) error {
	select {
	case <-s.failed:
		return errSendFailed
	default:
	}
	select {
	case s.queue <- msg:
		return nil
	case <-s.failed:
		return errSendFailed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close ends the queue and waits until everything queued was sent (or the
// stream failed). Callers must not send afterwards.
func (s *sender) close() error {
	s.once.Do(func() { close(s.queue) })
	<-s.done
	return s.err
}
