//go:build gc
// +build gc

package core

import "net/http"

// setVersions sets the HTTP versions of tr (valid ones). http.Protocols is
// newer than Yaegi's net/http: the go tool (gc) compiles this file, Yaegi
// loads transport_versions_yaegi.go instead (it honours only `+build`
// lines and does not set the gc tag).
func setVersions(tr *http.Transport, versions []string) error {
	protocols := new(http.Protocols)
	for _, v := range versions {
		switch v {
		case "1.1":
			protocols.SetHTTP1(true)
		case "2":
			protocols.SetHTTP2(true)
		case "h2c":
			protocols.SetUnencryptedHTTP2(true)
		}
	}
	tr.Protocols = protocols
	return nil
}
