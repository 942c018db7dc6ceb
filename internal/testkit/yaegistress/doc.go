// Package yaegistress proves that llmhedge's core and Traefik plugin are safe
// when the Yaegi interpreter (v0.16.1, the version Traefik embeds) runs them
// concurrently, and keeps the minimal reproductions of the interpreter bugs
// that shaped them. Everything lives in its tests; see README.md.
//
// The package is test-only on purpose: it imports the interpreter, which the
// plugin itself must never do, and `yaegi test ./traefikplugin` does not
// load it because it is a separate package.
package yaegistress
