//go:build race

package yaegistress

// raceEnabled is true under `go test -race`. The select repro is a data race
// inside the interpreter, so the race detector would abort it; it is
// skipped then (see repro_select_test.go).
const raceEnabled = true
