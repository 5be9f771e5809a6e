package rsock

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
)

// What a Listener logs, and at which level:
//
//   - WARN: a client that sent bytes that are no rsock hello (curl, a stock
//     http.Client, a plain net.Dial), refused because AcceptPlainClients is off. It
//     is the first mistake of a new user and is otherwise invisible (the client sees
//     "connection reset by peer"), so the message says how to serve such clients.
//     Also accept errors (out of file descriptors, say), as before.
//   - INFO: any other failed handshake (a malformed or slow hello, a connection closed
//     before its first byte, as health checks do).
//   - DEBUG: each accepted connection, with its transport and fallback reason.

// logHandshakeFailure reports a connection whose handshake failed.
func (l *Listener) logHandshakeFailure(remote net.Addr, transport string, err error) {
	if errors.Is(err, ErrNotRsockPeer) && !errors.Is(err, io.ErrUnexpectedEOF) {
		l.cfg.Logger.Warn("rsock: refused a client that speaks no rsock; set Config.AcceptPlainClients to serve plain TCP clients (curl, a stock http.Client) too",
			"remote", remote.String(), "transport", transport, "err", err)
		return
	}
	l.cfg.Logger.Info("rsock: handshake failed", "remote", remote.String(), "transport", transport, "err", err)
}

// logAccepted reports a connection handed to Accept. It costs nothing but a level
// check unless DEBUG is enabled.
func (l *Listener) logAccepted(c *Conn) {
	if !l.cfg.Logger.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	attrs := []slog.Attr{slog.String("remote", c.RemoteAddr().String()), slog.String("transport", c.Transport())}
	if r := c.FallbackReason(); r != nil {
		attrs = append(attrs, slog.String("reason", r.Error()))
	}
	l.cfg.Logger.LogAttrs(context.Background(), slog.LevelDebug, "rsock: accepted", attrs...)
}

// defaultLogger is the Logger of a Config that sets none: the process's [slog.Default]
// at the moment of each record (so a later slog.SetDefault is followed), passing only
// WARN and above. See [Config.Logger] for why. It is one Logger for every Config: it
// holds no state of its own, and a dial need not make one.
func defaultLogger() *slog.Logger { return warnDefaultLogger }

var warnDefaultLogger = slog.New(warnDefault{})

// warnDefault is a slog.Handler that hands records of level WARN and above to
// slog.Default's handler. attrs and groups, set by WithAttrs and WithGroup, are applied
// to that handler when a record is handled.
type warnDefault struct {
	with []func(slog.Handler) slog.Handler
}

func (h warnDefault) handler() slog.Handler {
	d := slog.Default().Handler()
	for _, w := range h.with {
		d = w(d)
	}
	return d
}

func (h warnDefault) Enabled(ctx context.Context, level slog.Level) bool {
	return level >= slog.LevelWarn && slog.Default().Handler().Enabled(ctx, level)
}

func (h warnDefault) Handle(ctx context.Context, r slog.Record) error {
	return h.handler().Handle(ctx, r)
}

func (h warnDefault) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnDefault{with: append(h.with[:len(h.with):len(h.with)], func(d slog.Handler) slog.Handler { return d.WithAttrs(attrs) })}
}

func (h warnDefault) WithGroup(name string) slog.Handler {
	return warnDefault{with: append(h.with[:len(h.with):len(h.with)], func(d slog.Handler) slog.Handler { return d.WithGroup(name) })}
}
