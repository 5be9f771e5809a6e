//go:build !unix

package rsock

import "net"

// dupSocket returns a second net.Conn on tcp's socket (see the unix version).
func dupSocket(tcp *net.TCPConn) (net.Conn, error) {
	f, err := tcp.File()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return net.FileConn(f)
}
