package envoyfilter

import (
	"net"
	"testing"
)

func TestIsLoopback(t *testing.T) {
	for _, tc := range []struct {
		ip   string
		want bool
	}{{"127.0.0.1", true}, {"::1", true}, {"0.0.0.0", false}, {"::", false}, {"10.0.0.5", false}} {
		if got := isLoopback(&net.TCPAddr{IP: net.ParseIP(tc.ip), Port: 9902}); got != tc.want {
			t.Errorf("isLoopback(%s) = %v, want %v", tc.ip, got, tc.want)
		}
	}
}
