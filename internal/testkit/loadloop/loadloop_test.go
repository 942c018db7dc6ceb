package loadloop

import (
	"sync"
	"testing"
)

func TestWorkersRunUntilStop(t *testing.T) {
	stop := make(chan struct{})
	var mu sync.Mutex
	seen := map[int]int{}
	started := make(chan struct{}, 3)
	wait := Workers(3, stop, func(w, i int) {
		mu.Lock()
		if i != seen[w] {
			t.Errorf("worker %d: call %d after %d calls, want the calls numbered in order", w, i, seen[w])
		}
		seen[w]++
		mu.Unlock()
		if i == 0 {
			started <- struct{}{}
		}
	})
	for k := 0; k < 3; k++ {
		<-started
	}
	close(stop)
	wait()
	if len(seen) != 3 {
		t.Errorf("%d workers ran, want 3", len(seen))
	}
}
