// Package e2e holds rsock's end-to-end tests: grpc-go, unmodified, over every rsock
// transport, and clients of every kind (RDMA over TCP or QUIC, TCP, QUIC, and plain
// clients that know nothing of rsock) sharing one Listener.
//
// The tests are in the _test.go files; internal/harness is what they share with the
// net/http tests in package rsockhttp and the examples' tests.
package e2e
