package fleetstore

import (
	"net/http"
	"testing"
)

func TestFleetHeadRoundTrip(t *testing.T) {
	hdr := http.Header{"Content-Type": {"text/event-stream"}, "X-Multi": {"a", "b"}}
	enc := EncodeHead(201, hdr) + "body\nbytes"
	status, got, rest, ok := DecodeHead(enc)
	if !ok || status != 201 || rest != "body\nbytes" || got.Get("Content-Type") != "text/event-stream" || len(got["X-Multi"]) != 2 {
		t.Errorf("decoded %d %v %q %v", status, got, rest, ok)
	}
	if _, _, _, ok := DecodeHead("20x\n\n"); ok {
		t.Error("a bad status decoded")
	}
}
