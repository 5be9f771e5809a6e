// Package workload holds the workloads and transports that rsock's benchmarks compare,
// shared by the go test benchmarks in package benchmarks and by the rsockperf command,
// so that both measure exactly the same thing.
//
// # Transports
//
// A [Transport] is one way of carrying a byte stream: raw soft verbs (the ceiling of the
// RDMA path on the software provider), rsock over soft RDMA, a raw [net.TCPConn], rsock
// over TCP, a raw quic-go stream, rsock over QUIC, and, as references, a unix socket
// and [net.Pipe]. [Start] runs a transport's server side and a client for it in one
// process; [Listen] and [Connect] split them over two processes.
//
// Every net.Conn workload talks to a [Server]. A client connection announces what it
// wants from the server in a 5-byte preamble, its first bytes:
//
//	role (1) | parameter (4, big-endian)
//
// Roles: 'D' drain (answer 'R' when ready, read to EOF in a buffer of parameter bytes,
// then answer the 8-byte count of bytes read), 'E' echo (answer each message of parameter bytes), 'F' first
// byte (write one byte, then read to EOF), 'I' idle (read to EOF), 'H' HTTP/1.1 and 'G'
// gRPC (the rest of the connection belongs to net/http's or grpc-go's server). The
// preamble costs every transport the same, once per connection, and gives a QUIC
// stream the first byte it needs to reach the server.
//
// # Workloads
//
// A [Workload] runs its operations for as long as a [Control] says: testing.B's Loop
// in a benchmark, [Timed] in rsockperf. It returns [Metrics]: bytes per operation and,
// for round trips and connection setups, latency percentiles. The workloads are:
//
//   - stream: one-way stream of Size-byte writes on one connection, drained by the
//     server into a Size-byte buffer.
//   - pingpong: a Size-byte message and its echo, one at a time; reports percentiles.
//   - conns: Conns connections streaming 64 KiB writes at once; reports the aggregate.
//   - setup: dial, preamble, and the server's first byte back; then close. Reports
//     percentiles of dial to first byte.
//   - http: net/http GETs of a 2-byte body ("tiny") or of a 1 MiB body by Conns
//     concurrent callers over keep-alive connections.
//   - grpc: grpc-go unary calls with a 64-byte request and answer, Conns concurrent
//     callers sharing one client connection.
//
// [Idle] measures memory instead: heap, registered memory, open files and goroutines
// per idle connection.
package workload
