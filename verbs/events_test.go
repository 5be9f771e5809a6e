package verbs

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestAsyncEventTypeString(t *testing.T) {
	tests := []struct {
		typ        AsyncEventType
		want       string
		port, qp   bool
		eventWant  AsyncEvent
		eventWants string
	}{
		{EventPortErr, "port error", true, false, AsyncEvent{Type: EventPortErr, Port: 2}, "port error on port 2"},
		{EventQPFatal, "QP fatal", false, true, AsyncEvent{Type: EventQPFatal, QPN: 0x11}, "QP fatal on QP 0x11"},
		{EventDeviceFatal, "device fatal", false, false, AsyncEvent{Type: EventDeviceFatal}, "device fatal"},
		{EventGIDChange, "GID change", true, false, AsyncEvent{Type: EventGIDChange, Port: 1}, "GID change on port 1"},
		{AsyncEventType(42), "AsyncEventType(42)", false, false, AsyncEvent{Type: 42}, "AsyncEventType(42)"},
	}
	for _, tt := range tests {
		if got := tt.typ.String(); got != tt.want {
			t.Errorf("AsyncEventType(%d).String() = %q, want %q", int(tt.typ), got, tt.want)
		}
		if got := tt.typ.PortEvent(); got != tt.port {
			t.Errorf("%v.PortEvent() = %v, want %v", tt.typ, got, tt.port)
		}
		if got := tt.typ.QPEvent(); got != tt.qp {
			t.Errorf("%v.QPEvent() = %v, want %v", tt.typ, got, tt.qp)
		}
		if got := tt.eventWant.String(); got != tt.eventWants {
			t.Errorf("%#v.String() = %q, want %q", tt.eventWant, got, tt.eventWants)
		}
	}
}

// TestAsyncEventQueue: events come out in order; a full queue drops its oldest event
// that is not fatal; Wait honours its context; Close wakes every waiter with ErrClosed.
func TestAsyncEventQueue(t *testing.T) {
	var q AsyncEventQueue
	q.Push(AsyncEvent{Type: EventDeviceFatal})
	for i := range MaxQueuedAsyncEvents + 9 {
		q.Push(AsyncEvent{Type: EventQPFatal, QPN: uint32(i)})
	}
	ctx := context.Background()
	e, err := q.Wait(ctx)
	if err != nil || e.Type != EventDeviceFatal {
		t.Fatalf("first Wait = %v, %v; want the fatal event, kept", e, err)
	}
	for i := 10; i < MaxQueuedAsyncEvents+9; i++ {
		e, err := q.Wait(ctx)
		if err != nil || e.QPN != uint32(i) {
			t.Fatalf("Wait = %v, %v; want QP %#x (the 10 oldest dropped)", e, err, i)
		}
	}
	short, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	if _, err := q.Wait(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on an empty queue = %v, want the context's error", err)
	}

	errs := make(chan error, 3)
	for range 3 {
		go func() { _, err := q.Wait(ctx); errs <- err }()
	}
	q.Close()
	for range 3 {
		if err := <-errs; !errors.Is(err, ErrClosed) {
			t.Fatalf("Wait after Close = %v, want ErrClosed", err)
		}
	}
	q.Push(AsyncEvent{Type: EventPortErr}) // ignored once closed
	if _, err := q.Wait(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Wait after Close and Push = %v, want ErrClosed", err)
	}
}
