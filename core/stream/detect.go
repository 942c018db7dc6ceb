package stream

import "errors"

// EventDetector finds the first output event of an upstream stream, by the
// same rules the race uses. Tools that measure TTFT (e.g. the tuning
// command) use it so they measure what the engine would race on.
type EventDetector struct {
	d *Detector
}

// NewEventDetector returns a detector for a response Content-Type and a
// first-event rule (RuleAuto, ...). ok is false when the content type is not
// a stream (the answer is then complete when its body ends).
func NewEventDetector(contentType, rule string) (d *EventDetector, ok bool) {
	format, ok := FormatOf(contentType)
	if !ok {
		return nil, false
	}
	return &EventDetector{d: NewDetector(format, rule, 0)}, true
}

// Feed consumes the next bytes. It reports output=true once the first output
// event is complete, or a non-nil error when the stream failed before output.
func (e *EventDetector) Feed(p []byte) (output bool, err error) {
	v, why := Feed(e.d, p)
	return verdictResult(v, why)
}

// End is called at the end of the body while no verdict was reached.
func (e *EventDetector) End() (output bool, err error) {
	v, why := e.d.End()
	return verdictResult(v, why)
}

func verdictResult(v Verdict, why string) (bool, error) {
	switch v {
	case VerdictOutput:
		return true, nil
	case VerdictFailure:
		return false, errors.New(why)
	}
	return false, nil
}
