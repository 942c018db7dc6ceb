package envoyfilter

import (
	"io"
	"testing"
)

// The pipe is bounded in bytes: it has room while it holds less than
// pipeLimit, whatever the number of chunks, and a chunk counts until it is
// read to its end.
func TestBodyPipeIsBoundedInBytes(t *testing.T) {
	p := newBodyPipe()
	small := make([]byte, 1024)
	for i := 0; i < pipeLimit/len(small)-1; i++ {
		p.write(small)
	}
	if !p.hasRoom() {
		t.Fatalf("no room at %d bytes, want room below %d", p.buffered, pipeLimit)
	}
	p.write(small)
	if p.hasRoom() {
		t.Fatalf("room at %d bytes (%d chunks), want none at the %d byte limit", p.buffered, len(p.chunks), pipeLimit)
	}
	big := make([]byte, 3*pipeLimit)
	q := newBodyPipe()
	q.write(big)
	if q.hasRoom() {
		t.Fatal("one chunk larger than the limit left room")
	}
	buf := make([]byte, pipeLimit)
	for i := 0; i < 2; i++ {
		if n, err := q.Read(buf); n != len(buf) {
			t.Fatalf("n = %v, want %v", n, len(buf))
		} else if err != nil {
			t.Fatal(err)
		}
		if q.hasRoom() {
			t.Fatalf("room after %d of %d bytes of a chunk were read; the chunk is still held", (i+1)*len(buf), len(big))
		}
	}
	q.Read(buf)
	if !q.hasRoom() {
		t.Fatalf("no room after the chunk was read (held %d bytes)", q.buffered)
	}
	// waitRoom returns once the reader frees the chunk.
	q.write(big)
	freed := make(chan struct{})
	go func() { q.waitRoom(nil); close(freed) }()
	io.CopyN(io.Discard, q, int64(len(big)))
	<-freed
	// Nobody reading any more: the chunks are released, writes dropped.
	p.Close()
	if !p.hasRoom() {
		t.Fatalf("after Close: %d bytes held, write taken", p.buffered)
	} else if p.buffered != 0 {
		t.Fatalf("after Close: p.buffered = %v, want 0", p.buffered)
	} else if p.write(small) {
		t.Fatalf("after Close: %d bytes held, write taken", p.buffered)
	}
}
