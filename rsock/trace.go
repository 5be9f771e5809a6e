package rsock

import "time"

// ConnTracer receives the events of one connection, for tracing or logging. Each field
// may be nil, and an event whose field is nil costs nothing. [Config.Tracer] creates
// one per connection.
//
// The functions are called synchronously, on the goroutine where the event happens
// (Failed on a goroutine of its own when the RDMA engine finds the failure), so they
// must be quick and must not block; they may call the Conn's methods, Stats included.
type ConnTracer struct {
	// Upgraded reports that the connection runs over RDMA, on transport "rdma" or
	// "rdma+tls". It is called as Dial returns the connection or Accept hands it out.
	Upgraded func(transport string)
	// FellBack reports that the connection stays on its bootstrap transport ("tcp" or
	// "quic"), and why: reason is [Conn.FallbackReason]. It is called as Dial returns
	// the connection or Accept hands it out.
	FellBack func(transport string, reason error)
	// CreditStall reports, on RDMA, a Write's wait for credit that just ended (the
	// peer's buffers were full: a slow reader), and how long it lasted. It runs on the
	// writer's goroutine.
	CreditStall func(waited time.Duration)
	// Failed reports the connection's first failure: an error that a Read or Write
	// returned, other than io.EOF, a deadline or a closed Conn, or, on RDMA, a failure
	// the engine found (a queue pair error, a lost peer), as soon as it finds it.
	Failed func(err error)
	// Closed reports that Close was called, with the connection's final statistics.
	Closed func(ConnStats)
}

// TraceInfo describes the connection [Config.Tracer] is asked to trace.
type TraceInfo struct {
	// Conn is the connection, already set up: its transport, fallback reason and
	// addresses are known.
	Conn *Conn
	// Client is true on the side that dialed.
	Client bool
}
