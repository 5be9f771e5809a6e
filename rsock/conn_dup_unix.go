//go:build unix

package rsock

import (
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// dupSocket returns a second net.Conn on tcp's socket, so that a closed Conn can still
// read the server's answer on it (closeBeforeReply). It duplicates the descriptor
// itself rather than through tcp.File: net.FileConn would take File's descriptor with
// os.File.Fd, which puts a network file into blocking mode, and that mode belongs to
// the socket tcp shares. A Write on tcp in that moment would block in the kernel while
// the peer does not read, and tcp.Close would wait for it for ever.
func dupSocket(tcp *net.TCPConn) (net.Conn, error) {
	raw, err := tcp.SyscallConn()
	if err != nil {
		return nil, err
	}
	nfd, dupErr := -1, error(nil)
	if err := raw.Control(func(fd uintptr) {
		nfd, dupErr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, err
	}
	if dupErr != nil {
		return nil, os.NewSyscallError("fcntl", dupErr)
	}
	f := os.NewFile(uintptr(nfd), "rsock-reply") // non-blocking already: Fd leaves it so
	defer f.Close()
	return net.FileConn(f)
}
