package main

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// progressRedraw is the shortest interval between two redraws of the
// terminal progress bar: redrawing per request would flood a slow terminal.
const progressRedraw = 100 * time.Millisecond

// progress reports done/total, elapsed and ETA on w: a bar redrawn in place
// with \r when w is a terminal, else a line at every 10 % (logs and CI
// keep a readable record).
type progress struct {
	w     io.Writer
	tty   bool
	total int
	start time.Time
	now   func() time.Time

	mu        sync.Mutex
	count     int
	lastDraw  time.Time
	lastTenth int
}

func newProgress(w io.Writer, total int) *progress {
	return &progress{w: w, tty: isTerminal(w), total: total, start: time.Now(), now: time.Now}
}

// done counts one finished request; safe for concurrent use.
func (p *progress) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.count++
	now := p.now()
	if p.tty {
		if now.Sub(p.lastDraw) >= progressRedraw || p.count == p.total {
			p.lastDraw = now
			fmt.Fprintf(p.w, "\r%s", p.line(now))
		}
		return
	}
	if tenth := p.count * 10 / p.total; tenth > p.lastTenth {
		p.lastTenth = tenth
		fmt.Fprintf(p.w, "llmhedge-tune: %s\n", p.line(now))
	}
}

// finish ends the bar's line.
func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprintf(p.w, "\r%s\n", p.line(p.now()))
	}
}

// line is "[=====>    ] 120/400  30%  elapsed 12s  ETA 28s".
func (p *progress) line(now time.Time) string {
	const width = 30
	elapsed := now.Sub(p.start)
	frac := float64(p.count) / float64(p.total)
	filled := int(frac * width)
	bar := strings.Repeat("=", filled)
	if filled < width {
		bar += ">" + strings.Repeat(" ", width-filled-1)
	}
	eta := "?"
	if p.count > 0 {
		remaining := time.Duration(float64(elapsed) * float64(p.total-p.count) / float64(p.count))
		eta = remaining.Round(time.Second).String()
	}
	return fmt.Sprintf("[%s] %d/%d %3.0f%%  elapsed %v  ETA %s ", bar, p.count, p.total, frac*100, elapsed.Round(time.Second), eta)
}
