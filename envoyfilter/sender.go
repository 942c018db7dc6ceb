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
//
// The queue is bounded in messages and in bytes: a pass-through stream
// echoes request body chunks as large as Envoy sends them, and an Envoy
// that stops reading must not make the server hold queueDepth of them.
type sender struct {
	queue  chan queuedMsg
	failed chan struct{} // closed when a Send failed; err says why
	done   chan struct{} // closed when the goroutine ends
	err    error
	once   sync.Once

	mu      sync.Mutex
	queued  int           // body bytes queued or being sent
	drained chan struct{} // a message went out (capacity 1)
}

type queuedMsg struct {
	msg  *extprocv3.ProcessingResponse
	size int
}

// queueDepth lets a writer run a few messages ahead of gRPC flow control
// without letting a stalled Envoy make the server buffer a whole answer.
// queueBytes bounds the body bytes among them: eight of the answer's 64 KiB
// chunks (envoy.body_chunk's default); one larger message may always be
// queued alone.
const (
	queueDepth = 8
	queueBytes = 8 * DefaultBodyChunk
)

func newSender(stream extprocv3.ExternalProcessor_ProcessServer) *sender {
	s := &sender{queue: make(chan queuedMsg, queueDepth),
		failed: make(chan struct{}), done: make(chan struct{}), drained: make(chan struct{}, 1)}
	go s.run(stream)
	return s
}

func (s *sender) run(stream extprocv3.ExternalProcessor_ProcessServer) {
	defer close(s.done)
	for q := range s.queue {
		err := stream.Send(q.msg)
		s.mu.Lock()
		s.queued -= q.size
		s.mu.Unlock()
		signal(s.drained)
		if err != nil {
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

// bodySize is the body payload of a reply, what can make it large.
func bodySize(msg *extprocv3.ProcessingResponse) int {
	switch r := msg.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_RequestBody:
		return len(r.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse().GetBody())
	case *extprocv3.ProcessingResponse_ResponseBody:
		return len(r.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse().GetBody())
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		return len(r.ImmediateResponse.GetBody())
	case *extprocv3.ProcessingResponse_StreamedImmediateResponse:
		return len(r.StreamedImmediateResponse.GetBodyResponse().GetBody())
	}
	return 0
}

// send queues msg. It blocks while the queue is full, in messages or in
// bytes (gRPC flow control pushing back), and fails when the stream is gone
// or ctx ends.
func (s *sender) send(ctx context.Context, msg *extprocv3.ProcessingResponse) error {
	select {
	case <-s.failed:
		return errSendFailed
	default:
	}
	size := bodySize(msg)
	for {
		s.mu.Lock()
		ok := s.queued == 0 || s.queued+size <= queueBytes
		if ok {
			s.queued += size
		}
		s.mu.Unlock()
		if ok {
			break
		}
		select {
		case <-s.drained:
		case <-s.failed:
			return errSendFailed
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	select {
	case s.queue <- queuedMsg{msg: msg, size: size}:
		return nil
	case <-s.failed:
		return errSendFailed
	case <-ctx.Done():
		s.mu.Lock()
		s.queued -= size
		s.mu.Unlock()
		// The bytes given back may be what a writer waits for, and no
		// drain of this message will wake it.
		signal(s.drained)
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
