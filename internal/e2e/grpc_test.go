package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rsockio/rsock/internal/echosvc"
	"github.com/rsockio/rsock/internal/harness"
)

func TestGRPCUnary(t *testing.T) {
	tests := []struct {
		size int
		code codes.Code
	}{
		{0, codes.OK},
		{1, codes.OK},
		{1 << 10, codes.OK},
		{64 << 10, codes.OK},
		{1 << 20, codes.OK},
		{maxMsg, codes.OK},
		{maxMsg + 1, codes.ResourceExhausted}, // grpc-go's own limit, as configured
	}
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		ctx := harness.Context(t)
		s, c, d := grpcPair(t, env, echosvc.Service{})
		for _, tt := range tests {
			in := echosvc.Fill(tt.size, tt.size)
			out, err := c.Echo(ctx, in)
			require.Equal(t, tt.code, status.Code(err), "Echo(%d bytes): %v", tt.size, err)
			if tt.code == codes.OK {
				require.True(t, bytes.Equal(in, out), "Echo(%d bytes) returned %d different bytes", tt.size, len(out))
			}
		}
		requireTransports(t, env, s, d)
	})
}

func TestGRPCServerStreaming(t *testing.T) {
	tests := []struct{ count, size int }{
		{0, 0},
		{1000, 100},
		{64, 256 << 10},
		{2, maxMsg},
	}
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		ctx := harness.Context(t)
		s, c, d := grpcPair(t, env, echosvc.Service{})
		for _, tt := range tests {
			stream, err := c.Generate(ctx, tt.count, tt.size)
			require.NoError(t, err)
			for i := range tt.count {
				m, err := stream.Recv()
				require.NoError(t, err, "Generate(%d, %d): message %d", tt.count, tt.size, i)
				require.True(t, bytes.Equal(echosvc.Fill(i, tt.size), m.Data), "Generate(%d, %d): message %d differs", tt.count, tt.size, i)
			}
			_, err = stream.Recv()
			require.ErrorIs(t, err, io.EOF, "Generate(%d, %d): after the last message", tt.count, tt.size)
		}
		requireTransports(t, env, s, d)
	})
}

func TestGRPCClientStreaming(t *testing.T) {
	sizes := []int{0, 1, 100, 64 << 10, 1 << 20, maxMsg, 3}
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		ctx := harness.Context(t)
		s, c, d := grpcPair(t, env, echosvc.Service{})
		stream, err := c.Digest(ctx)
		require.NoError(t, err)
		h := sha256.New()
		var n int64
		for i, size := range sizes {
			b := echosvc.Fill(i, size)
			h.Write(b)
			n += int64(size)
			require.NoError(t, stream.Send(&echosvc.Message{Data: b}), "message %d of %d bytes", i, size)
		}
		got, err := stream.CloseAndRecv()
		require.NoError(t, err)
		require.Equal(t, echosvc.DigestOf(n, h.Sum(nil)).Data, got.Data, "digest of %d bytes in %d messages", n, len(sizes))
		requireTransports(t, env, s, d)
	})
}

func TestGRPCBidi(t *testing.T) {
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		ctx := harness.Context(t)
		s, c, d := grpcPair(t, env, echosvc.Service{})

		t.Run("ping-pong", func(t *testing.T) {
			stream, err := c.Chat(ctx)
			require.NoError(t, err)
			for i := range 200 {
				b := echosvc.Fill(i, i*37)
				require.NoError(t, stream.Send(&echosvc.Message{Data: b}))
				m, err := stream.Recv()
				require.NoError(t, err, "reply %d", i)
				require.True(t, bytes.Equal(b, m.Data), "reply %d differs", i)
			}
			require.NoError(t, stream.CloseSend())
			_, err = stream.Recv()
			require.ErrorIs(t, err, io.EOF)
		})

		// Both directions at once, with messages up to maxMsg: the sender does not wait
		// for replies, so flow control holds both ends' windows full.
		t.Run("full-duplex", func(t *testing.T) {
			sizes := []int{maxMsg, 1, 256 << 10, maxMsg, 1000}
			for range 20 {
				sizes = append(sizes, 32<<10)
			}
			stream, err := c.Chat(ctx)
			require.NoError(t, err)
			sent := make(chan error, 1)
			go func() {
				for i, size := range sizes {
					if err := stream.Send(&echosvc.Message{Data: echosvc.Fill(i, size)}); err != nil {
						sent <- fmt.Errorf("send %d: %w", i, err)
						return
					}
				}
				sent <- stream.CloseSend()
			}()
			for i, size := range sizes {
				m, err := stream.Recv()
				require.NoError(t, err, "reply %d", i)
				require.True(t, bytes.Equal(echosvc.Fill(i, size), m.Data), "reply %d of %d bytes differs", i, size)
			}
			_, err = stream.Recv()
			require.ErrorIs(t, err, io.EOF)
			require.NoError(t, <-sent)
		})
		requireTransports(t, env, s, d)
	})
}

// observer is echosvc's Service that reports how its calls ended. Its Echo waits for
// the end of the call when asked to "wait".
type observer struct {
	echosvc.Service
	ended chan error // each call's context error, once the call is over
}

func newObserver() *observer { return &observer{ended: make(chan error, 16)} }

// next returns how the next call ended, or, should no call end before ctx does (a
// handler that never ran), an error that says so rather than a test that hangs. That
// error does not wrap ctx's: the guard's own DeadlineExceeded would pass for the
// call's.
func (o *observer) next(ctx context.Context) error {
	select {
	case err := <-o.ended:
		return err
	case <-ctx.Done():
		return fmt.Errorf("no call's handler ended before the test's guard (%v)", ctx.Err())
	}
}

func (o *observer) Echo(ctx context.Context, req *echosvc.Message) (*echosvc.Message, error) {
	if string(req.Data) != "wait" {
		return o.Service.Echo(ctx, req)
	}
	<-ctx.Done()
	o.ended <- ctx.Err()
	return nil, status.FromContextError(ctx.Err()).Err()
}

func (o *observer) Generate(req *echosvc.Message, stream grpc.ServerStreamingServer[echosvc.Message]) error {
	err := o.Service.Generate(req, stream)
	<-stream.Context().Done() // the call is over when the client has seen its end
	o.ended <- stream.Context().Err()
	return err
}

func (o *observer) Chat(stream grpc.BidiStreamingServer[echosvc.Message, echosvc.Message]) error {
	err := o.Service.Chat(stream)
	<-stream.Context().Done()
	o.ended <- stream.Context().Err()
	return err
}

// TestGRPCDeadline lets a unary call and a stream run past their deadlines: the client
// gets DeadlineExceeded, and the server's handler sees its context end. (It ends with
// DeadlineExceeded if the server's own timer fires first, or Canceled if the client's
// cancellation arrives first; grpc-go does both.) The connection is made first, by a
// call without a deadline: grpc-go dials at the first call, and where setting up (an
// RDMA upgrade and a TLS handshake, in the CI's emulated VM) takes longer than the
// deadline, the call would end before its request reached the server, whose handler
// then never runs.
func TestGRPCDeadline(t *testing.T) {
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		ctx := harness.Context(t)
		o := newObserver()
		s, c, d := grpcPair(t, env, o)
		_, err := c.Echo(ctx, []byte("connect"))
		require.NoError(t, err)

		t.Run("unary", func(t *testing.T) {
			dctx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			_, err := c.Echo(dctx, []byte("wait"))
			require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
			requireEnded(t, o.next(ctx))
		})
		t.Run("stream", func(t *testing.T) {
			dctx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			stream, err := c.Chat(dctx)
			require.NoError(t, err)
			require.NoError(t, stream.Send(&echosvc.Message{Data: []byte("hi")}))
			m, err := stream.Recv()
			require.NoError(t, err)
			require.Equal(t, "hi", string(m.Data))
			_, err = stream.Recv() // the server waits for more; the deadline ends the call
			require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
			requireEnded(t, o.next(ctx))
		})
		// A deadline ends its call, not the connection: it still works.
		out, err := c.Echo(ctx, []byte("after"))
		require.NoError(t, err)
		require.Equal(t, "after", string(out))
		requireTransports(t, env, s, d)
	})
}

// deadline is the deadline of calls that are meant to run out of time. Nothing is
// timed against it; it only sets how long those tests wait.
const deadline = 100 * time.Millisecond

// requireEnded checks the server's view of a call whose deadline passed.
func requireEnded(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		t.Fatalf("server's context ended with %v, want DeadlineExceeded or Canceled", err)
	}
}

// TestGRPCCancel cancels a server stream that would run for a long time: the client's
// Recv returns Canceled, and the server's handler sees the cancellation and stops.
func TestGRPCCancel(t *testing.T) {
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		ctx := harness.Context(t)
		o := newObserver()
		s, c, d := grpcPair(t, env, o)
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		// MaxGenerateCount messages of 64 KiB: 64 GiB, far more than the test lets through.
		stream, err := c.Generate(cctx, echosvc.MaxGenerateCount, 64<<10)
		require.NoError(t, err)
		for i := range 10 {
			_, err := stream.Recv()
			require.NoError(t, err, "message %d", i)
		}
		cancel()
		for err == nil { // messages already buffered may still arrive
			_, err = stream.Recv()
		}
		require.Equal(t, codes.Canceled, status.Code(err), "%v", err)
		require.ErrorIs(t, o.next(ctx), context.Canceled, "server's view")

		out, err := c.Echo(ctx, []byte("after"))
		require.NoError(t, err)
		require.Equal(t, "after", string(out))
		requireTransports(t, env, s, d)
	})
}

// streamCounter is echosvc's Service counting the Chat streams open at once.
type streamCounter struct {
	echosvc.Service
	open, max atomic.Int64
}

func (sc *streamCounter) Chat(stream grpc.BidiStreamingServer[echosvc.Message, echosvc.Message]) error {
	n := sc.open.Add(1)
	defer sc.open.Add(-1)
	for {
		m := sc.max.Load()
		if n <= m || sc.max.CompareAndSwap(m, n) {
			break
		}
	}
	return sc.Service.Chat(stream)
}

// TestGRPCConcurrentStreams runs 100 Chat streams at once on one client connection:
// every stream has its first reply before any is closed.
func TestGRPCConcurrentStreams(t *testing.T) {
	const (
		streams = 100
		rounds  = 10
	)
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		ctx := harness.Context(t)
		sc := new(streamCounter)
		s, c, d := grpcPair(t, env, sc)

		var first sync.WaitGroup // every stream has had its first reply
		first.Add(streams)
		errs := make(chan error, streams)
		var wg sync.WaitGroup
		for g := range streams {
			wg.Go(func() {
				errs <- chat(ctx, c, g, rounds, first.Done, first.Wait)
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.EqualValues(t, streams, sc.max.Load(), "Chat streams open at once on the server")
		requireTransports(t, env, s, d) // all on one connection
	})
}

// chat runs rounds of request and reply on a new Chat stream. After the first reply it
// calls replied, then waits(). replied is called even if the stream fails, so that the
// other streams do not wait forever.
func chat(ctx context.Context, c *echosvc.Client, id, rounds int, replied, wait func()) (err error) {
	once := sync.OnceFunc(replied)
	defer once()
	stream, err := c.Chat(ctx)
	if err != nil {
		return fmt.Errorf("stream %d: %w", id, err)
	}
	for r := range rounds {
		b := echosvc.Fill(id, 100+r)
		if err := stream.Send(&echosvc.Message{Data: b}); err != nil {
			return fmt.Errorf("stream %d: send %d: %w", id, r, err)
		}
		m, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("stream %d: reply %d: %w", id, r, err)
		}
		if !bytes.Equal(b, m.Data) {
			return fmt.Errorf("stream %d: reply %d differs", id, r)
		}
		if r == 0 {
			once()
			wait()
		}
	}
	if err := stream.CloseSend(); err != nil {
		return fmt.Errorf("stream %d: close: %w", id, err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("stream %d: after close: %v, want EOF", id, err)
	}
	return nil
}

// TestGRPCGracefulStop stops the server while a stream is open: the server stops
// listening at once, the stream goes on until the client ends it, and only then does
// GracefulStop return.
func TestGRPCGracefulStop(t *testing.T) {
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		ctx := harness.Context(t)
		s, c, d := grpcPair(t, env, echosvc.Service{})
		stream, err := c.Chat(ctx)
		require.NoError(t, err)
		roundTrip := func(i int) {
			t.Helper()
			b := echosvc.Fill(i, 1000)
			require.NoError(t, stream.Send(&echosvc.Message{Data: b}))
			m, err := stream.Recv()
			require.NoError(t, err, "reply %d", i)
			require.True(t, bytes.Equal(b, m.Data), "reply %d differs", i)
		}
		roundTrip(0)

		stopped := make(chan struct{})
		go func() {
			s.GracefulStop()
			close(stopped)
		}()
		<-s.ln.Closed()
		for i := 1; i <= 10; i++ {
			roundTrip(i)
		}
		select {
		case <-stopped:
			t.Fatal("GracefulStop returned with a stream open")
		default:
		}
		require.NoError(t, stream.CloseSend())
		_, err = stream.Recv()
		require.ErrorIs(t, err, io.EOF)
		select {
		case <-stopped:
		case <-ctx.Done():
			t.Fatal("GracefulStop did not return after the last stream ended")
		}
		require.NoError(t, s.wait(), "Serve after GracefulStop")
		requireTransports(t, env, s, d)
	})
}

// TestObserverNextGuard: a wait for a handler that the test's guard ends is an error
// neither requireEnded nor a check for Canceled accepts, so a handler that never ran
// fails the test rather than passing it as a call that ran out of time.
func TestObserverNextGuard(t *testing.T) {
	ctx, cancel := context.WithDeadline(t.Context(), time.Unix(1, 0))
	defer cancel()
	err := newObserver().next(ctx)
	require.Error(t, err)
	require.NotErrorIs(t, err, context.DeadlineExceeded)
	require.NotErrorIs(t, err, context.Canceled)
}
