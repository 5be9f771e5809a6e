package rsock

import (
	"context"
	"net"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHandshakeCtx checks that a handshakeCtx behaves as context.WithDeadline(parent,
// deadline) does: its deadline, its error before and after the deadline and after the
// parent's cancellation, and its Done channel, whether Done is first asked for before
// or after the end.
func TestHandshakeCtx(t *testing.T) {
	const timeout = 10 * time.Second
	tests := []struct {
		name         string
		parentAfter  time.Duration // the parent's own deadline from now; 0: none
		cancelAt     time.Duration // when the parent is cancelled; 0: never
		doneFirst    bool          // Done is asked for at the start, not at the end
		wait         time.Duration
		wantDeadline time.Duration
		wantErr      error
	}{
		{name: "before the deadline", wait: timeout / 2, wantDeadline: timeout},
		{name: "at the deadline", wait: timeout, wantDeadline: timeout, wantErr: context.DeadlineExceeded},
		{name: "at the deadline, Done first", doneFirst: true, wait: timeout, wantDeadline: timeout, wantErr: context.DeadlineExceeded},
		{name: "parent's earlier deadline", parentAfter: timeout / 4, wait: timeout / 4, wantDeadline: timeout / 4, wantErr: context.DeadlineExceeded},
		{name: "parent's later deadline", parentAfter: 2 * timeout, wait: timeout / 2, wantDeadline: timeout},
		{name: "parent cancelled", cancelAt: timeout / 4, wait: timeout / 2, wantDeadline: timeout, wantErr: context.Canceled},
		{name: "parent cancelled, Done first", cancelAt: timeout / 4, doneFirst: true, wait: timeout / 2, wantDeadline: timeout, wantErr: context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				parent, cancel := context.WithCancel(context.Background())
				defer cancel()
				if tt.parentAfter > 0 {
					var c context.CancelFunc
					parent, c = context.WithDeadline(parent, start.Add(tt.parentAfter))
					defer c()
				}
				if tt.cancelAt > 0 {
					time.AfterFunc(tt.cancelAt, cancel)
				}
				var h handshakeCtx
				h.init(parent, start.Add(timeout))
				defer h.release()
				var done <-chan struct{}
				if tt.doneFirst {
					done = h.Done()
				}
				time.Sleep(tt.wait) // the bubble's clock
				synctest.Wait()
				dl, ok := h.Deadline()
				require.True(t, ok)
				require.Equal(t, tt.wantDeadline, dl.Sub(start), "deadline")
				require.ErrorIs(t, h.Err(), tt.wantErr, "Err after %v", tt.wait)
				if tt.wantErr == nil {
					require.NoError(t, h.Err(), "Err after %v", tt.wait)
				}
				if done == nil {
					done = h.Done()
				}
				synctest.Wait()
				select {
				case <-done:
					require.Error(t, tt.wantErr, "Done closed after %v, before the end", tt.wait)
				default:
					require.NoError(t, tt.wantErr, "Done open after %v, past the end", tt.wait)
				}
				require.Equal(t, h.Err(), h.made.Err(), "Err once Done made its context")
			})
		})
	}
}

// TestHandshakeCtxNoTimer checks what the type is for: a handshake that asks only for
// the deadline and the error allocates nothing and makes no context, and parentDone
// waits on the parent's channel alone.
func TestHandshakeCtxNoTimer(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	var h handshakeCtx
	allocs := testing.AllocsPerRun(100, func() {
		h.init(parent, time.Now().Add(time.Minute))
		if _, ok := h.Deadline(); !ok || h.Err() != nil {
			panic("no deadline, or an error before it")
		}
		h.release()
	})
	require.Zero(t, allocs, "allocations of init, Deadline, Err and release")
	require.Nil(t, h.made, "a context made without a call to Done")

	tests := []struct {
		name string
		ctx  context.Context
		want <-chan struct{}
	}{
		{name: "handshakeCtx", ctx: &h, want: parent.Done()},
		{name: "handshakeCtx of Background", ctx: func() context.Context {
			var b handshakeCtx
			b.init(context.Background(), time.Now().Add(time.Minute))
			return &b
		}(), want: nil},
		{name: "other context", ctx: parent, want: parent.Done()},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, parentDone(tt.ctx), "parentDone(%s)", tt.name)
	}
	require.Nil(t, h.made, "a context made by parentDone")
}

// TestBindDeadline checks bindDeadline with a context that can end and one that cannot:
// the deadline is the earlier bound, cleared by stop; a context that ends first sets
// it in the past and stop returns its error; one that cannot end costs no watcher.
func TestBindDeadline(t *testing.T) {
	tests := []struct {
		name    string
		timeout time.Duration
		ctx     func() (context.Context, context.CancelFunc)
		cancel  bool // cancel the ctx before stop
		want    time.Duration
		wantErr error
	}{
		{name: "background", timeout: time.Minute,
			ctx: func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }, want: time.Minute},
		{name: "earlier ctx deadline", timeout: time.Minute,
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), time.Second)
			}, want: time.Second},
		{name: "cancelled", timeout: time.Minute, cancel: true,
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithCancel(context.Background())
			}, want: time.Minute, wantErr: context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := tt.ctx()
				defer cancel()
				conn := &deadlineRecorder{}
				start := time.Now()
				b := bindDeadline(ctx, conn, tt.timeout)
				require.Equal(t, ctx.Done() != nil, b.stopAfter != nil, "a watcher iff ctx can end")
				require.Equal(t, tt.want, conn.deadline.Sub(start), "deadline while bound")
				if tt.cancel {
					cancel()
					synctest.Wait()
					require.True(t, conn.deadline.Before(start), "deadline after ctx ended: %v", conn.deadline)
				}
				err := b.stop()
				require.ErrorIs(t, err, tt.wantErr)
				if tt.wantErr == nil {
					require.NoError(t, err)
					require.True(t, conn.deadline.IsZero(), "deadline after stop: %v", conn.deadline)
				}
			})
		})
	}
}

// deadlineRecorder is a net.Conn that records its last deadline.
type deadlineRecorder struct {
	net.Conn
	deadline time.Time
}

func (c *deadlineRecorder) SetDeadline(t time.Time) error {
	c.deadline = t
	return nil
}
