// Package rdma is rsock's RDMA stream engine: a byte stream over one reliable-connected
// queue pair, with the bytes written by RDMA_WRITE_WITH_IMM straight into the peer's
// pre-posted receive ring and paced by package flowctl's credits.
//
// The engine knows nothing of which verbs provider it runs on, nor of the hello that
// negotiated it: rsock's upgrade step calls [Prepare] on each side to create a QP and
// register a ring, exchanges the two [Offer]s over the bootstrap connection, and calls
// [Endpoint.Connect] to bring the QP to RTS and obtain a [Conn].
//
// Devices are shared: one opened context, protection domain and set of CQs per
// provider and device, whatever the number of connections. The port and the source GID
// belong to each connection: [PrepareContext] picks them by the bootstrap connection's
// local IP and names the GID by its hardware index in the port's table, which may have
// holes. Finding and opening the device is bounded by the caller's context, and a burst
// of connections on a cold cache lists the provider's devices once.
//
// Files follow the data path: setup.go (resources and QP transitions), conn_send.go
// (Write), conn_recv.go (Read), conn_flow.go (credits), conn_close.go (FIN and
// teardown), poller.go (completion polling shared by many connections), device.go
// (per-device shared context, PD and CQs).
package rdma
