package rsock

import (
	"fmt"

	"github.com/rsockio/rsock/rsock/internal/rdma"
)

// CloseIdleDevices closes the RDMA devices that no connection uses now. After its last
// connection closes, a device stays open for a while (10 s; at most four devices), so
// that the next connection skips listing, opening and preparing it. An open device
// holds its context, a completion queue and, on rdma-core, one goroutine reading the
// device's events. Call CloseIdleDevices to release them at once: at the end of a
// program's shutdown, or in a test before checking for leaked goroutines, as
// [net/http.Transport.CloseIdleConnections] does for idle connections. Devices in use are
// left alone; the next connection opens a device again. The endpoint a Listener keeps
// prepared for its next client is released first, so that it keeps no device open.
func CloseIdleDevices() error {
	releaseSpares()
	if err := rdma.CloseIdle(nil); err != nil {
		return fmt.Errorf("rsock: close idle devices: %w", err)
	}
	return nil
}
