// Package loadloop runs the closed-loop load of the end-to-end tests: a
// number of workers, each sending one request after another until told to
// stop.
package loadloop

import "sync"

// Workers starts n goroutines; worker w calls do(w, i) for i = 0, 1, 2, ...
// and checks stop before each call. The returned wait blocks until every
// worker has returned (close stop first).
func Workers(n int, stop <-chan struct{}, do func(worker, i int)) (wait func()) {
	var wg sync.WaitGroup
	for w := 0; w < n; w++ {
		w := w
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				do(w, i)
			}
		}()
	}
	return wg.Wait
}
