package traefikplugin

import "net/http"

// abortResponse ends a response whose upstream failed after it started, so
// that the client sees a broken stream instead of a complete one.
//
// The net/http way is panic(http.ErrAbortHandler), and it is the fallback.
// Under Yaegi v0.16.1, though, a panic raised in interpreted code reaches
// compiled callers as a reflect.Value holding the error, not the error
// itself: Traefik's recovery middleware then no longer recognises
// http.ErrAbortHandler and logs every aborted stream as a crash with a stack
// trace (the connection is still closed). So on HTTP/1.x, where aborting a
// response means closing its connection anyway, the plugin takes the
// connection over and closes it; the bytes already written were flushed
// after every event, and the missing chunked terminator tells the client
// the answer is incomplete. HTTP/2 streams cannot be hijacked and take the
// panic path (the stream is reset).
func abortResponse(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}
