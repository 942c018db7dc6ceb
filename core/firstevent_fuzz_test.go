package core

// Yaegi: `yaegi test` v0.16.1 loads this file as is. Its stdlib symbols
// include testing.F, so FuzzFirstEventDetector compiles; it only collects
// func(*testing.T) and func(*testing.B), so the fuzz target is never run
// there (the properties it checks are also checked on fixed streams by
// TestFirstEventSplitAtEveryByte, which Yaegi runs). Should a later Yaegi
// fail to load it, the guard is `//go:build gc` plus `// +build gc`: Yaegi
// honours only `+build` lines and does not set the gc tag, while the go tool
// (gc compiler) does.

import "testing"

// FuzzFirstEventDetector checks, for any body, rule, line limit and split
// point: no panic; the verdict and reason are the same whether the body is
// fed at once, in two pieces or byte by byte; End never leaves the verdict
// pending; the line and data buffers never exceed maxLine.
//
//	go test -run='^$' -fuzz=FuzzFirstEventDetector -fuzztime=20s ./core
func FuzzFirstEventDetector(f *testing.F) {
	rules := []string{RuleAuto, RuleOpenAIChat, RuleOpenAIResponses, RuleAnthropic, RuleAny}
	sse := []string{chatStream, chatNoOutputStream, chatFinishOnlyStream, responsesStream, anthropicStream, anthropicErrorStream, otherStream,
		"data: {\"choices\":\r\ndata: [{\"delta\":\rdata: {\"content\":\"a\"}}]}\n\r\n",
		"\xEF\xBB\xBFevent: error\ndata: {\"error\":{\"message\":\"overloaded\"}}\n\n",
		"data: {\"type\":\"response.failed\",\"response\":{\"error\":{\"message\":\"x\"}}}\r\r",
	}
	for i, s := range sse {
		f.Add([]byte(s), len(s)/2, uint8(i), false, uint16(4096))
		f.Add([]byte(s), i*7, uint8(0), false, uint16(40)) // small limit: line failures
	}
	nd := []string{ollamaChatStream, ollamaGenerateStream,
		"{\"error\":\"model not found\"}\n",
		"{\"response\":\"\",\"done\":false}\r\n{\"response\":\"a\"",
		"{}\n[1]\nnull\n{\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n",
	}
	for i, s := range nd {
		f.Add([]byte(s), len(s)/3, uint8(i), true, uint16(4096))
		f.Add([]byte(s), i*11, uint8(4), true, uint16(50))
	}
	f.Fuzz(func(t *testing.T, body []byte, split int, rule uint8, ndjson bool, maxLine uint16) {
		format := formatSSE
		if ndjson {
			format = formatNDJSON
		}
		limit := 1 + int(maxLine)%8192
		if split < 0 {
			split = -(split + 1)
		}
		split = split % (len(body) + 1)
		detectSplits(t, format, rules[int(rule)%len(rules)], limit, string(body), split)
	})
}
