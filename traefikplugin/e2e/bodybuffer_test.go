package e2e

// bodyBuffer is a minimal local plugin used only by the truncation study:
// it reads the whole request body into memory before handing the request
// to Traefik's own load balancer, and changes nothing else. Comparing it
// with the plain load balancer isolates the effect of buffering the
// request body.
var bodyBuffer = extraPlugin{
	alias:  "bodybuffer",
	module: "example.com/bodybuffer",
	manifest: `displayName: Body buffer (test)
type: middleware
import: example.com/bodybuffer
summary: Buffers the request body, for a comparison in llmhedge's tests.
testData: {}
`,
	files: map[string]string{"bodybuffer.go": `package bodybuffer

import (
	"bytes"
	"context"
	"io"
	"net/http"
)

type Config struct{}

func CreateConfig() *Config { return &Config{} }

type buffer struct{ next http.Handler }

func New(ctx context.Context, next http.Handler, config *Config, name string) (http.Handler, error) {
	return &buffer{next: next}, nil
}

func (b *buffer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	b.next.ServeHTTP(w, r)
}
`},
}
