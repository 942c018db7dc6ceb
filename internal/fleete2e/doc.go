// Package fleete2e runs the acceptance scenarios of fleet mode part 2
// (internal/testkit/fleetsuite) through a mixed fleet: three real Caddy
// processes with the llm_hedge module and two real Traefik v3.6.12
// processes with the local plugin, sharing one real redis-server. It has
// only tests; see acceptance_test.go for the forms and their commands.
package fleete2e
