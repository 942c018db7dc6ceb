// Package probe holds small functions, each exercising one language or
// library construct, that the yaegistress tests call from many goroutines at
// once, both compiled and interpreted by Yaegi v0.16.1, to learn which
// constructs stay correct under concurrent interpretation.
//
// Every probe has the shape func(id int) int and must return id: any other
// value is another invocation's answer (or garbage), a panic or a hang is a
// failure too. The same source is compiled by `go test` (the control) and
// copied into a GOPATH for the interpreter, so the two runs differ only in
// who executes it.
//
// The probes in unsafe.go reproduce interpreter bugs on purpose (select,
// `return <-ch`, a multi-assignment of struct fields with a call on the
// right, errors.As on an interpreted error type); core and the plugin must
// not use those constructs. The probes in safe.go are the constructs they do
// use.
package probe
