package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// TestProgressUpdate checks what update writes on a terminal: the line in progress
// erased (a carriage return, blanks, a carriage return), then the measurement and its
// percentage, as fmt's "%s %s %3.0f%%" of its prefix, label and fraction would write
// them.
func TestProgressUpdate(t *testing.T) {
	for _, tt := range []struct {
		total, done int
		frac        float64
	}{
		{1, 0, 0}, {9, 3, 0.054}, {44, 0, 0.5}, {44, 43, 0.995}, {100, 7, 1}, {1000, 0, 1.7},
	} {
		var buf bytes.Buffer
		p := &progress{w: &buf, tty: true, total: tt.total, done: tt.done}
		p.begin("stream 64B SoftVerbs")
		first := buf.String()
		buf.Reset()
		p.update(tt.frac)
		want := "\r" + strings.Repeat(" ", len(first)) + "\r" +
			fmt.Sprintf("[%*d/%d] %s %3.0f%%", len(fmt.Sprint(tt.total)), tt.done+1, tt.total, "stream 64B SoftVerbs", 100*min(tt.frac, 1))
		if got := buf.String(); got != want {
			t.Errorf("progress{total: %d, done: %d}.update(%v) wrote %q, want %q", tt.total, tt.done, tt.frac, got, want)
		}
		buf.Reset()
		p.clear()
		if got, want := buf.String(), "\r"+strings.Repeat(" ", len(want)-len(first)-2)+"\r"; got != want {
			t.Errorf("clear after update(%v) wrote %q, want %q", tt.frac, got, want)
		}
	}
}
