package bpfsys

import "testing"

func TestChargesMemlock(t *testing.T) {
	for _, tt := range []struct {
		release string
		want    bool
	}{
		{"5.10.0-33-amd64", true},
		{"4.18.0-553.el8_10.x86_64", true},
		{"5.11.0", false},
		{"6.1.0-40-amd64", false},
		{"6.18.1", false},
		{"10.0", false},
		{"", true},
		{"garbage", true},
		{"5.x", true},
	} {
		if got := chargesMemlock(tt.release); got != tt.want {
			t.Errorf("chargesMemlock(%q) = %v, want %v", tt.release, got, tt.want)
		}
	}
}
