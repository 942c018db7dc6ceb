package core

// Config.HedgeStoredResponses: the operator asserts that a stored response
// created twice is acceptable. Both attempts of a hedged Responses API
// call (which stores by default) create a stored response upstream; the
// loser's is orphaned: it costs its storage and shows in the provider's
// dashboard and logs, its ID is never returned to the client, and it is
// never continued. What remains sent once without an idempotency key:
//
//   - "background": true: a background response is a job that runs to
//     completion upstream when its connection closes, so a cancelled loser
//     would still be billed in full;
//   - "conversation": items are appended to a shared conversation, and a
//     duplicate would append them twice;
//   - tools that act (mcp, code_interpreter, shell, ...).
//
// "previous_response_id" only reads a stored response: it is hedged like
// any stored response, and every upstream of the route must hold that
// response (the same organization and project), or the hedge answers 404
// (previous_response_not_found), which is fatal and held while the other
// attempt runs.

// changesMoreThanStore reports whether a request that keysChangeState
// found stateful changes more than the response it stores.
func changesMoreThanStore(k *bodyKeys) bool {
	if string(k.background) == "true" || k.conversation != nil && string(k.conversation) != "null" {
		return true
	}
	return k.tools != nil && toolsMayAct(k.tools)
}
