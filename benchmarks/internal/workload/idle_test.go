package workload

import "testing"

// TestConnsWithinFiles: how many idle connections fit the room left under the process's
// limit of open files.
func TestConnsWithinFiles(t *testing.T) {
	tests := []struct {
		name                string
		n, perConn, room, w int
	}{
		{"all fit", 5000, 2, 19000, 5000},
		{"exactly", 5000, 2, 10000, 5000},
		{"capped", 5000, 12, 18000, 1500},
		{"none fit", 5000, 12, 5, 0},
		{"no room at all", 5000, 12, -40, 0},
		{"opens no file", 5000, 0, 10, 5000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := connsWithinFiles(tt.n, tt.perConn, tt.room); got != tt.w {
				t.Errorf("connsWithinFiles(%d, %d, %d) = %d, want %d", tt.n, tt.perConn, tt.room, got, tt.w)
			}
		})
	}
}
