// Package verbstest is the conformance suite of package verbs: it states, as tests, the
// rules an RC provider must obey, and runs them against any [verbs.Provider]. Every
// provider's tests call [Run]: verbs/soft always, verbs/ibv where a device exists.
//
// # Usage
//
//	func TestConformance(t *testing.T) {
//		verbstest.Run(t, func(t *testing.T) verbs.Provider { return newProvider(t) })
//	}
//
// Each rule is a subtest with its own provider, named after the rule, so that
// `go test -run 'Conformance/Ordering'` runs one:
//
//   - StateMachine, PostSendRequiresRTS: the QP state machine (RESET → ERROR refused, as
//     by the kernel); sends only in RTS.
//   - SendQueueOverflow, RecvQueueOverflow: posting past the queue's capacity fails at
//     once with ErrQueueFull, naming the rejected request; never below the capacity the
//     QP reports, which a device may exceed.
//   - RNRRetryExceeded, RNRRetryForever: a SEND or WRITE_WITH_IMM without a receive WQE
//     is retried rnr_retry times (7: forever), then fails with RNR_RETRY_EXC_ERR.
//   - RemoteAccessBadRKey, RemoteAccessBounds, RemoteAccessFlags: rkey, bounds and access
//     rights are checked; a violation is REM_ACCESS_ERR (REM_INV_REQ_ERR allowed for the
//     QP's access flags) and both QPs go to ERROR.
//   - RemoteAccessOtherConnection: with a protection domain per connection on one
//     context, a request naming another connection's region is refused the same way,
//     and that other connection carries on untouched.
//   - SendLongerThanRecvBuffer: LOC_LEN_ERR and REM_INV_REQ_ERR (or REM_OP_ERR), both
//     QPs in ERROR.
//   - Ordering, WriteWithImmVisibleBeforeCompletion: per-QP order of execution and
//     completion; RDMA write data is in place when its receive completion is polled.
//   - UnsignaledNoCompletion, UnsignaledSlotsFreedBySignaled: unsignaled WRs complete
//     silently; their send-queue slots are free at the latest once a later signaled
//     completion is polled (a device may free them when they retire).
//   - CQOverflow: a completion beyond the CQ's capacity makes Poll fail with
//     ErrCQOverflow.
//   - ErrorFlush, PostInErrorFlushes: in ERROR every outstanding or newly posted WR
//     completes with WR_FLUSH_ERR, in order, unsignaled ones included.
//   - DeadPeer: requests to a destroyed, reset, failed or unconnected peer end in
//     RETRY_EXC_ERR.
//   - FaultBreakLink, FaultRepairLink, FaultDelay, FaultFailQP, FaultAllocFailure,
//     FaultFailQPEvent: the behaviour of injected faults, for providers that implement
//     [Faults]; FaultPortDown, for providers that implement [PortFaults]: a port that
//     goes down raises EventPortErr and loses requests without failing QPs, one that
//     comes back raises EventPortActive.
//   - AsyncEventsClosed, AsyncEventsContext: WaitAsyncEvent ends with ErrClosed once
//     its context is closed, and with the Go context's error when that ends first.
//
// Where real devices legitimately differ, a rule accepts each behaviour the verbs contract
// (the man pages, the InfiniBand specification) allows, and its comment says which and
// why; where a simulator would accept what the kernel refuses, the rule refuses it.
//
// The remaining subtests (LocalProtection, RTRReceives, SendWithImmScatter,
// ZeroLengthRecv, InlineSend, RDMARead, CompChannelWait, CompChannelSolicitedOnly,
// CloseInUse) check the operations the rules are built on.
//
// # Timing
//
// The suite runs on real devices too, so it never asserts that something happens within a
// time: it polls with a generous overall deadline, and asserts only lower bounds ("not
// before the injected delay") and absence where the absence is already decided when the
// check runs (a request queued behind a stalled one). Transport timers use hardware
// settings: ACK timeout 14 (67 ms) with 3 retries, RNR timer 12 (0.64 ms).
//
// # Two hosts
//
// [Suite] runs the rules with each pair's two ends on two providers: side a in the test
// process, side b possibly in another process on another host, behind the agent protocol
// ([ServeAgent] there, [DialAgent] here). [OnAddr] picks each host's device by its IP
// address. The rules drive side b only through the verbs API, so every rule runs across
// the wire; a rule that checks memory the moment a completion is polled keeps that poller
// on side a.
//
// # Optional interfaces
//
// Hardware rounds queue and CQ sizes up, so the suite asks a QP for the capacities it
// really has through [CapsReporter] and a CQ through [CapacityReporter]; a provider that
// can report them should. Without them the suite finds queue capacities by filling the
// queues and checks CQ overflow against a bound. Fault injection tests need [Faults]; a
// provider without it skips them, saying so.
package verbstest

import (
	"errors"
	"testing"
	"time"

	"github.com/rsockio/rsock/verbs"
)

// Faults is implemented by providers that can inject faults (verbs/soft does).
type Faults interface {
	// BreakQP loses every request qp sends or is sent until RepairQP: the requester
	// retransmits and, once its retry count is spent, completes with RETRY_EXC_ERR.
	BreakQP(qp verbs.QP) error
	// RepairQP undoes BreakQP; requests awaiting retransmission are delivered.
	RepairQP(qp verbs.QP) error
	// DelayQP delays the delivery of each request qp posts from now on by d.
	DelayQP(qp verbs.QP, d time.Duration) error
	// FailQP moves qp to ERROR as a fatal asynchronous error does.
	FailQP(qp verbs.QP) error
	// FailAllocs makes the next n allocations of kind fail with verbs.ErrNoResources.
	// Kinds: "context" (Open), "pd", "mr", "cq", "qp", "channel" (CreateCompChannel).
	FailAllocs(kind string, n int) error
}

// CapsReporter is implemented by QPs that report the capacities they were given, which
// may exceed those asked for.
type CapsReporter interface {
	Caps() verbs.QPCaps
}

// CapacityReporter is implemented by CQs that report how many completions they hold.
type CapacityReporter interface {
	Capacity() int
}

// Transport settings the suite connects QPs with.
const (
	ackTimeout = 14 // 4.096 µs × 2^14 ≈ 67 ms
	retryCount = 3
	rnrTimer   = 12 // 0.64 ms
	waitLimit  = 20 * time.Second
)

type rule struct {
	name string
	run  func(t *testing.T, p providers)
}

// rules lists the suite. The first group states the rules of RC hardware that every
// provider must follow; the rest check the operations the rules are built on.
var rules = []rule{
	{"StateMachine", testStateMachine},
	{"PostSendRequiresRTS", testPostSendRequiresRTS},
	{"SendQueueOverflow", testSendQueueOverflow},
	{"RecvQueueOverflow", testRecvQueueOverflow},
	{"RNRRetryExceeded", testRNRRetryExceeded},
	{"RNRRetryForever", testRNRRetryForever},
	{"RemoteAccessBadRKey", testRemoteAccessBadRKey},
	{"RemoteAccessBounds", testRemoteAccessBounds},
	{"RemoteAccessFlags", testRemoteAccessFlags},
	{"RemoteAccessOtherConnection", testRemoteAccessOtherConnection},
	{"SendLongerThanRecvBuffer", testSendLongerThanRecvBuffer},
	{"Ordering", testOrdering},
	{"WriteWithImmVisibleBeforeCompletion", testWriteWithImmVisible},
	{"UnsignaledNoCompletion", testUnsignaledNoCompletion},
	{"UnsignaledSlotsFreedBySignaled", testUnsignaledSlotsFreedBySignaled},
	{"CQOverflow", testCQOverflow},
	{"ErrorFlush", testErrorFlush},
	{"PostInErrorFlushes", testPostInErrorFlushes},
	{"DeadPeer", testDeadPeer},
	{"FaultBreakLink", testFaultBreakLink},
	{"FaultRepairLink", testFaultRepairLink},
	{"FaultDelay", testFaultDelay},
	{"FaultFailQP", testFaultFailQP},
	{"FaultAllocFailure", testFaultAllocFailure},
	{"FaultFailQPEvent", testFaultFailQPEvent},
	{"FaultPortDown", testFaultPortDown},
	{"AsyncEventsClosed", testAsyncEventsClosed},
	{"AsyncEventsContext", testAsyncEventsContext},

	{"LocalProtection", testLocalProtection},
	{"RTRReceives", testRTRReceives},
	{"SendWithImmScatter", testSendWithImmScatter},
	{"ZeroLengthRecv", testZeroLengthRecv},
	{"InlineSend", testInlineSend},
	{"RDMARead", testRDMARead},
	{"CompChannelWait", testCompChannelWait},
	{"CompChannelSolicitedOnly", testCompChannelSolicitedOnly},
	{"CloseInUse", testCloseInUse},
}

// Run runs every rule of the suite as a subtest of t, each against a fresh provider from
// newProvider. Providers with two or more devices get QP pairs that span two devices.
func Run(t *testing.T, newProvider func(t *testing.T) verbs.Provider) {
	Suite{Providers: func(t *testing.T) (a, b verbs.Provider) {
		p := newProvider(t)
		return p, p
	}}.Run(t)
}

// Suite is the conformance suite with its options; [Run] is Suite with one provider.
type Suite struct {
	// Providers returns, for each rule, the providers of the rule's two sides. Side a is
	// the one the test process drives; side b is where the peer of each pair lives. They
	// are the same provider, or b is a peer across a real wire (see [DialAgent]).
	Providers func(t *testing.T) (a, b verbs.Provider)
}

// Run runs every rule of the suite as a subtest of t.
func (s Suite) Run(t *testing.T) {
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			a, b := s.Providers(t)
			for _, p := range []verbs.Provider{a, b} {
				devs, err := p.Devices()
				if errors.Is(err, verbs.ErrNoDevice) || (err == nil && len(devs) == 0) {
					t.Skipf("provider %s has no device", p.Name())
				}
				if err != nil {
					t.Fatalf("%s: Devices() = %v", p.Name(), err)
				}
			}
			r.run(t, providers{a, b})
		})
	}
}

// faultsOf returns the fault injection of side a's provider, skipping the test if it has
// none.
func faultsOf(t *testing.T, p providers) Faults {
	t.Helper()
	f, ok := p.a.(Faults)
	if !ok {
		t.Skipf("provider %s does not implement verbstest.Faults: fault injection not available", p.a.Name())
	}
	return f
}
