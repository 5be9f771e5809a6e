package workload

import (
	"context"
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
)

// The gRPC service is described by hand, without protoc: one unary method whose
// messages are raw bytes (rawCodec), answered with the request.
const (
	grpcService = "rsockbench.Echo"
	grpcMethod  = "/" + grpcService + "/Echo"
)

var echoService = grpc.ServiceDesc{
	ServiceName: grpcService,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Echo",
		Handler: func(srv any, ctx context.Context, dec func(any) error, intercept grpc.UnaryServerInterceptor) (any, error) {
			msg := new([]byte)
			if err := dec(msg); err != nil {
				return nil, err
			}
			if intercept == nil {
				return msg, nil
			}
			info := &grpc.UnaryServerInfo{Server: srv, FullMethod: grpcMethod}
			return intercept(ctx, msg, info, func(ctx context.Context, req any) (any, error) { return req, nil })
		},
	}},
}

func newGRPCServer() *grpc.Server {
	s := grpc.NewServer(grpc.ForceServerCodecV2(rawCodec{}))
	s.RegisterService(&echoService, struct{}{})
	return s
}

// rawCodec marshals *[]byte messages as themselves.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	p, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(*p)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	p, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	n := data.Len()
	if cap(*p) < n {
		*p = make([]byte, n)
	}
	*p = (*p)[:n]
	data.CopyTo(*p)
	return nil
}

func (rawCodec) Name() string { return "rsockbench-raw" }

// runGRPC has p.Conns callers make unary calls of p.Size bytes each way, on one client
// connection (one HTTP/2 connection), as a grpc-go application would.
func runGRPC(ctl Control, env *Env, p Params) (Metrics, error) {
	conc := max(p.Conns, 1)
	cc, err := grpc.NewClient("passthrough:///rsockperf",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return env.open(ctx, roleGRPC, 0)
		}),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})),
	)
	if err != nil {
		return Metrics{}, err
	}
	defer cc.Close()
	reqs, resps := make([][]byte, conc), make([][]byte, conc)
	for i := range reqs {
		reqs[i] = make([]byte, p.Size)
	}
	ctx := context.Background()
	call := func(w int) error {
		if err := cc.Invoke(ctx, grpcMethod, &reqs[w], &resps[w]); err != nil {
			return err
		}
		if len(resps[w]) != p.Size {
			return errors.New("grpc: answer of the wrong size")
		}
		return nil
	}
	if err := call(0); err != nil { // warm up: connect
		return Metrics{}, err
	}
	if err := fanOut(ctl, conc, call); err != nil {
		return Metrics{}, err
	}
	return Metrics{BytesPerOp: 2 * int64(p.Size)}, nil
}
