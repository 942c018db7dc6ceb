package heyload

import (
	"testing"
	"time"
)

// A report of hey 0.1.4 (Debian's), abridged: answers by status and an
// error distribution.
const report = `
Summary:
  Total:	4.0125 secs
  Slowest:	0.0412 secs
  Requests/sec:	1250.5000

Status code distribution:
  [200]	4990 responses
  [502]	6 responses

Error distribution:
  [4]	Post "http://127.0.0.1:1/v1/chat/completions": dial tcp 127.0.0.1:1: connect: connection refused
`

func TestParseReadsTimeStatusesAndErrors(t *testing.T) {
	r, err := parse([]byte(report))
	if err != nil {
		t.Fatal(err)
	}
	if r.OK != 4990 || r.Failed != 10 {
		t.Errorf("ok %d failed %d, want 4990 and 10 (6 answered 502, 4 errors)", r.OK, r.Failed)
	}
	if r.Wall != 4012500*time.Microsecond {
		t.Errorf("wall %v, want 4.0125s", r.Wall)
	}
	if want := 4990 / 4.0125; r.RPS() < want-0.01 || r.RPS() > want+0.01 {
		t.Errorf("RPS %.2f, want %.2f", r.RPS(), want)
	}
	if _, err := parse([]byte("Status code distribution:\n  [200]\t3 responses\n")); err == nil {
		t.Error("a report without its total time parsed, want an error")
	}
}
