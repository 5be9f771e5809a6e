//go:build !linux

package ibv

import (
	"bytes"
	"os"
)

// readAttrInto reads the file at path and returns its content without the trailing
// newline, or ok false if it cannot be read. Only Linux has sysfs; elsewhere this
// serves the tests' fake trees. buf is used as in the Linux version: content beyond
// its length is cut.
func readAttrInto(path string, buf []byte) (_ []byte, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, false
	}
	n := copy(buf, b)
	return bytes.TrimSpace(buf[:n]), true
}
