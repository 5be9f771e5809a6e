package testaddr

import "testing"

func TestOffLoopbackIPv4(t *testing.T) {
	a := OffLoopbackIPv4(t)
	if !a.Is4() || a.IsLoopback() || !a.IsGlobalUnicast() {
		t.Fatalf("OffLoopbackIPv4 = %v, want a global unicast IPv4 address", a)
	}
}
