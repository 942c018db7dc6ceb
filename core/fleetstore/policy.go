package fleetstore

import "strings"

// policyOf reads CONFIG GET maxmemory-policy's outcome: the policy,
// or the error reply's text (refusal; also for an answer without the
// parameter), or answered false when Redis did not answer at all.
func policyOf(v RedisValue, err error) (policy, refusal string, answered bool) {
	if err != nil {
		if !isRedisErrorReply(err) || transientReply(err.Error()) {
			return "", "", false
		}
		return "", err.Error(), true
	}
	// RESP2: ["maxmemory-policy", "allkeys-lru"].
	if v.Kind == RedisArray && len(v.Array) == 2 && v.Array[1].Kind == RedisString {
		return strings.ToLower(v.Array[1].Str), "", true
	}
	return "", "no maxmemory-policy in CONFIG GET's answer", true
}

// isRedisErrorReply reports whether err is an error reply of the server
// (its text starts with an upper-case code: "ERR", "NOPERM", "LOADING")
// rather than a failure to get one (a timeout, a closed connection).
func isRedisErrorReply(err error) bool {
	msg := err.Error()
	code := msg
	if i := strings.IndexByte(msg, ' '); i >= 0 {
		code = msg[:i]
	}
	if len(code) < 2 || code == "EOF" {
		return false
	}
	for i := 0; i < len(code); i++ {
		if c := code[i]; (c < 'A' || c > 'Z') && c != '_' {
			return false
		}
	}
	return true
}

// transientReply reports whether an error reply says "not now" (a
// Redis loading its data, a busy script, a cluster or replica in
// transition): the policy is read again at the next round.
func transientReply(msg string) bool {
	for _, code := range []string{"LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN"} {
		if strings.HasPrefix(msg, code) {
			return true
		}
	}
	return false
}
