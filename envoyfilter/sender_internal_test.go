package envoyfilter

import (
	"context"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// blockedStream's Send reports each message on entered and returns once
// release is closed.
type blockedStream struct {
	extprocv3.ExternalProcessor_ProcessServer
	entered chan struct{}
	release chan struct{}
}

func (s *blockedStream) Send(*extprocv3.ProcessingResponse) error {
	s.entered <- struct{}{}
	<-s.release
	return nil
}

// A send whose ctx ends while the queue is full gives its reserved bytes
// back and says so on drained, as a sent message does: a writer waiting
// for bytes must not sleep until the next drain (with nothing queued,
// there is none).
func TestSenderCancelledSendSignalsDrained(t *testing.T) {
	st := &blockedStream{entered: make(chan struct{}, queueDepth+2), release: make(chan struct{})}
	s := newSender(st)
	defer func() {
		close(st.release)
		s.close()
	}()
	bg := context.Background()
	if err := s.send(bg, &extprocv3.ProcessingResponse{}); err != nil {
		t.Fatal(err)
	}
	<-st.entered // the sender is in Send; the queue is empty
	for i := 0; i < queueDepth; i++ {
		if err := s.send(bg, &extprocv3.ProcessingResponse{}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	body := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_StreamedImmediateResponse{
		StreamedImmediateResponse: &extprocv3.StreamedImmediateResponse{
			Response: &extprocv3.StreamedImmediateResponse_BodyResponse{
				BodyResponse: &extprocv3.StreamedBodyResponse{Body: make([]byte, 1024)}}}}}
	if err := s.send(ctx, body); err != context.Canceled {
		t.Fatalf("send on a full queue with an ended ctx = %v, want %v", err, context.Canceled)
	}
	s.mu.Lock()
	queued := s.queued
	s.mu.Unlock()
	if queued != 0 {
		t.Fatalf("queued = %d bytes after the cancelled send, want 0", queued)
	}
	if n := len(s.drained); n != 1 {
		t.Fatalf("drained holds %d signals after the cancelled send gave its bytes back, want 1", n)
	}
}
