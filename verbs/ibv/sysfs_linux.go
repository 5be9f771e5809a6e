package ibv

import (
	"bytes"

	"golang.org/x/sys/unix"
)

// readAttrInto reads the sysfs attribute at path into buf and returns its content
// without the trailing newline, or the error that kept it from being read. It is the GID
// table's inner loop: a port's table holds every index up to its length (1,024 on rxe),
// populated or not, so a table read opens that many files. One open, one read and one
// close per entry, into a caller's buffer, keep that cheap; os.ReadFile would add two
// fstat calls and an allocation per entry. An attribute longer than buf is cut short,
// which a caller parsing it sees as malformed.
func readAttrInto(path string, buf []byte) ([]byte, error) {
	if openFault != nil {
		if err := openFault(path); err != nil {
			return nil, err
		}
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	for err == unix.EINTR {
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, err // the bare errno: no allocation for an unreadable entry
	}
	defer unix.Close(fd)
	n, err := unix.Read(fd, buf)
	for err == unix.EINTR {
		n, err = unix.Read(fd, buf)
	}
	if err != nil {
		return nil, err
	}
	return bytes.TrimSpace(buf[:n]), nil
}
