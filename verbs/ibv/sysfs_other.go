//go:build !linux

package ibv

import (
	"bytes"
)

// readAttrInto reads the file at path and returns its content without the trailing
// newline, or the error that kept it from being read. Only Linux has sysfs; elsewhere this
// serves the tests' fake trees. buf is used as in the Linux version: content beyond
// its length is cut.
func readAttrInto(path string, buf []byte) ([]byte, error) {
	b, err := readFile(path)
	if err != nil {
		return nil, err
	}
	n := copy(buf, b)
	return bytes.TrimSpace(buf[:n]), nil
}
