package envoyfilter_test

import (
	"testing"

	"go.uber.org/goleak"
)

// No test leaves a goroutine behind: streams, handlers, senders, upstream
// attempts and the driver's closes all end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
