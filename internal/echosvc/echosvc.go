// Package echosvc is a small gRPC service written by hand, so that rsock's examples and
// tests run grpc-go without a protoc step. It has one method of each kind:
//
//   - Echo (unary) returns its request.
//   - Generate (server streaming) sends a requested number of messages of a requested
//     size, message i filled with [Fill](i, size).
//   - Digest (client streaming) reads messages until the client closes its side and
//     answers with their total length and SHA-256.
//   - Chat (bidirectional streaming) sends back each message as it arrives.
//
// Every message is a [Message], a slice of bytes, marshaled by [Codec]. The package
// registers the codec with grpc-go under the name [CodecName], so a stock grpc.Server
// needs no option to serve the service; [Client] asks for the codec on every call.
//
// # Usage
//
//	s := grpc.NewServer()
//	echosvc.Register(s, echosvc.Service{})
//	go s.Serve(ln)
//
//	cc, err := grpc.NewClient(target, opts...)
//	c := echosvc.NewClient(cc)
//	out, err := c.Echo(ctx, []byte("hello"))
package echosvc

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

// ServiceName is the gRPC name of the service.
const ServiceName = "rsock.echo.v1.Echo"

// The service's full method names.
const (
	EchoMethod     = "/" + ServiceName + "/Echo"
	GenerateMethod = "/" + ServiceName + "/Generate"
	DigestMethod   = "/" + ServiceName + "/Digest"
	ChatMethod     = "/" + ServiceName + "/Chat"
)

// Limits of a Generate request.
const (
	MaxGenerateCount = 1 << 20
	MaxGenerateSize  = 64 << 20
)

// Message is every request and response of the service.
type Message struct {
	Data []byte
}

// CodecName is the name under which [Codec] is registered with grpc-go, and the
// content-subtype of the service's calls ("application/grpc+rsock-bytes").
const CodecName = "rsock-bytes"

func init() {
	encoding.RegisterCodecV2(Codec{})
}

// Codec is a grpc-go codec (encoding.CodecV2) whose wire format for a [*Message] is its
// Data, as is. Marshal does not copy Data, so a message must not be modified once sent,
// as grpc-go requires of every message; Unmarshal copies.
type Codec struct{}

// Name returns [CodecName].
func (Codec) Name() string { return CodecName }

// Marshal returns m's Data; m must be a *Message.
func (Codec) Marshal(m any) (mem.BufferSlice, error) {
	msg, ok := m.(*Message)
	if !ok {
		return nil, fmt.Errorf("echosvc: cannot marshal %T, only *echosvc.Message", m)
	}
	if len(msg.Data) == 0 {
		return nil, nil
	}
	return mem.BufferSlice{mem.SliceBuffer(msg.Data)}, nil
}

// Unmarshal copies data into m, which must be a *Message.
func (Codec) Unmarshal(data mem.BufferSlice, m any) error {
	msg, ok := m.(*Message)
	if !ok {
		return fmt.Errorf("echosvc: cannot unmarshal into %T, only *echosvc.Message", m)
	}
	msg.Data = data.Materialize()
	return nil
}

// Server is the service's implementation, as grpc-go calls it.
type Server interface {
	// Echo returns req.
	Echo(ctx context.Context, req *Message) (*Message, error)
	// Generate sends the messages that req asks for (see [GenerateRequest]).
	Generate(req *Message, stream grpc.ServerStreamingServer[Message]) error
	// Digest reads messages until the client closes its side, then sends one made by
	// [DigestOf] of their concatenated Data.
	Digest(stream grpc.ClientStreamingServer[Message, Message]) error
	// Chat sends back each message it receives, until the client closes its side.
	Chat(stream grpc.BidiStreamingServer[Message, Message]) error
}

// Register registers srv with s, a *grpc.Server.
func Register(s grpc.ServiceRegistrar, srv Server) {
	s.RegisterService(&ServiceDesc, srv)
}

// ServiceDesc describes the service to grpc-go, as protoc-gen-go-grpc would.
var ServiceDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*Server)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Echo", Handler: echoHandler},
	},
	Streams: []grpc.StreamDesc{
		{StreamName: "Generate", Handler: generateHandler, ServerStreams: true},
		{StreamName: "Digest", Handler: digestHandler, ClientStreams: true},
		{StreamName: "Chat", Handler: chatHandler, ServerStreams: true, ClientStreams: true},
	},
}

func echoHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	req := new(Message)
	if err := dec(req); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(Server).Echo(ctx, req)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: EchoMethod}
	return interceptor(ctx, req, info, func(ctx context.Context, req any) (any, error) {
		return srv.(Server).Echo(ctx, req.(*Message))
	})
}

func generateHandler(srv any, stream grpc.ServerStream) error {
	req := new(Message)
	if err := stream.RecvMsg(req); err != nil {
		return err
	}
	return srv.(Server).Generate(req, &grpc.GenericServerStream[Message, Message]{ServerStream: stream})
}

func digestHandler(srv any, stream grpc.ServerStream) error {
	return srv.(Server).Digest(&grpc.GenericServerStream[Message, Message]{ServerStream: stream})
}

func chatHandler(srv any, stream grpc.ServerStream) error {
	return srv.(Server).Chat(&grpc.GenericServerStream[Message, Message]{ServerStream: stream})
}

// GenerateRequest returns the request for count messages of size bytes each.
func GenerateRequest(count, size int) *Message {
	b := make([]byte, 16)
	binary.BigEndian.PutUint64(b[:8], uint64(count))
	binary.BigEndian.PutUint64(b[8:], uint64(size))
	return &Message{Data: b}
}

// ParseGenerateRequest returns the count and size req asks for, or an error with code
// InvalidArgument if it is malformed or beyond [MaxGenerateCount] or [MaxGenerateSize].
func ParseGenerateRequest(req *Message) (count, size int, err error) {
	if len(req.Data) != 16 {
		return 0, 0, status.Errorf(codes.InvalidArgument, "echosvc: generate request of %d bytes, want 16", len(req.Data))
	}
	c, s := binary.BigEndian.Uint64(req.Data[:8]), binary.BigEndian.Uint64(req.Data[8:])
	if c > MaxGenerateCount || s > MaxGenerateSize {
		return 0, 0, status.Errorf(codes.InvalidArgument, "echosvc: generate %d messages of %d bytes: over the limit", c, s)
	}
	return int(c), int(s), nil
}

// Fill returns message i of a Generate stream of size-byte messages. Each message has
// different contents, so that a lost, repeated or reordered one is seen.
func Fill(i, size int) []byte {
	// A block of a prime length, so that the pattern does not line up with any
	// power-of-two buffer or frame size, repeated by copying (fast, even under the race
	// detector).
	const block = 4093
	b := make([]byte, size)
	n := min(size, block)
	for j := range n {
		b[j] = byte(i*7 + j + j>>8)
	}
	for n < size {
		n += copy(b[n:], b[:n])
	}
	return b
}

// DigestOf returns the response of Digest for a stream of n bytes in total whose
// SHA-256 is sum: n (8 bytes, big-endian) then sum.
func DigestOf(n int64, sum []byte) *Message {
	b := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(sum)), uint64(n))
	return &Message{Data: append(b, sum...)}
}

// Service is the service's plain implementation. Embed it to change one method.
type Service struct{}

// Echo returns req.
func (Service) Echo(_ context.Context, req *Message) (*Message, error) {
	return req, nil
}

// Generate sends the messages req asks for, stopping early if the call ends.
func (Service) Generate(req *Message, stream grpc.ServerStreamingServer[Message]) error {
	count, size, err := ParseGenerateRequest(req)
	if err != nil {
		return err
	}
	for i := range count {
		if err := stream.Send(&Message{Data: Fill(i, size)}); err != nil {
			return err
		}
	}
	return nil
}

// Digest answers with the length and SHA-256 of everything received.
func (Service) Digest(stream grpc.ClientStreamingServer[Message, Message]) error {
	h := sha256.New()
	var n int64
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(DigestOf(n, h.Sum(nil)))
		}
		if err != nil {
			return err
		}
		h.Write(m.Data)
		n += int64(len(m.Data))
	}
}

// Chat sends back every message it receives.
func (Service) Chat(stream grpc.BidiStreamingServer[Message, Message]) error {
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := stream.Send(m); err != nil {
			return err
		}
	}
}

// Client calls the service.
type Client struct {
	cc grpc.ClientConnInterface
}

// NewClient returns a Client calling through cc, a *grpc.ClientConn.
func NewClient(cc grpc.ClientConnInterface) *Client {
	return &Client{cc: cc}
}

// callOptions prepends the codec's content-subtype to opts.
func callOptions(opts []grpc.CallOption) []grpc.CallOption {
	return append([]grpc.CallOption{grpc.CallContentSubtype(CodecName)}, opts...)
}

// Echo sends data and returns the server's answer.
func (c *Client) Echo(ctx context.Context, data []byte, opts ...grpc.CallOption) ([]byte, error) {
	out := new(Message)
	if err := c.cc.Invoke(ctx, EchoMethod, &Message{Data: data}, out, callOptions(opts)...); err != nil {
		return nil, err
	}
	return out.Data, nil
}

// Generate asks for count messages of size bytes and returns the stream they arrive
// on. Message i should equal Fill(i, size).
func (c *Client) Generate(ctx context.Context, count, size int, opts ...grpc.CallOption) (grpc.ServerStreamingClient[Message], error) {
	s, err := c.cc.NewStream(ctx, &ServiceDesc.Streams[0], GenerateMethod, callOptions(opts)...)
	if err != nil {
		return nil, err
	}
	if err := s.SendMsg(GenerateRequest(count, size)); err != nil {
		return nil, err
	}
	if err := s.CloseSend(); err != nil {
		return nil, err
	}
	return &grpc.GenericClientStream[Message, Message]{ClientStream: s}, nil
}

// Digest opens a Digest stream: Send messages, then CloseAndRecv the digest, which
// should equal DigestOf of what was sent.
func (c *Client) Digest(ctx context.Context, opts ...grpc.CallOption) (grpc.ClientStreamingClient[Message, Message], error) {
	s, err := c.cc.NewStream(ctx, &ServiceDesc.Streams[1], DigestMethod, callOptions(opts)...)
	if err != nil {
		return nil, err
	}
	return &grpc.GenericClientStream[Message, Message]{ClientStream: s}, nil
}

// Chat opens a Chat stream.
func (c *Client) Chat(ctx context.Context, opts ...grpc.CallOption) (grpc.BidiStreamingClient[Message, Message], error) {
	s, err := c.cc.NewStream(ctx, &ServiceDesc.Streams[2], ChatMethod, callOptions(opts)...)
	if err != nil {
		return nil, err
	}
	return &grpc.GenericClientStream[Message, Message]{ClientStream: s}, nil
}

var _ encoding.CodecV2 = Codec{}
