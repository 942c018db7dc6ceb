//go:build !gc
// +build !gc

package core

import (
	"fmt"
	"net/http"
)

// setVersions, interpreted: Yaegi v0.16.1's net/http (Go 1.22) has no
// http.Protocols, so only the default versions, HTTP/1.1 and HTTP/2 by
// ForceAttemptHTTP2, can be had (see transport_versions.go).
func setVersions(tr *http.Transport, versions []string) error {
	if len(versions) == 2 && versions[0] == "1.1" && versions[1] == "2" {
		return nil
	}
	return fmt.Errorf("transport: versions %v need a compiled build; interpreted, only 1.1 and 2", versions)
}
