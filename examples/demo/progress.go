package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"
)

// progress draws one status line per variant on stderr.
type progress struct {
	w     io.Writer
	tty   bool // redraw one line; otherwise print every quarter
	name  string
	total int
	start time.Time
	last  time.Time
}

func newProgress(w io.Writer, name string, total int) *progress {
	p := &progress{w: w, name: name, total: total, start: time.Now()}
	// A terminal, not any character device: /dev/null is one too.
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.tty = true
	}
	p.update(0)
	return p
}

// update is called after each request (serialised by refload).
func (p *progress) update(done int) {
	if !p.tty {
		if done == 0 || done*4/p.total != (done-1)*4/p.total {
			fmt.Fprintf(p.w, "%s: %d/%d requests, %.1fs\n", p.name, done, p.total, time.Since(p.start).Seconds())
		}
		return
	}
	if done != p.total && time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	width := 30
	filled := width * done / p.total
	fmt.Fprintf(p.w, "\r%-30s [%s%s] %5d/%d %5.1fs", p.name, strings.Repeat("#", filled), strings.Repeat(".", width-filled),
		done, p.total, time.Since(p.start).Seconds())
}

func (p *progress) done() {
	if p.tty {
		fmt.Fprintln(p.w)
	}
}
