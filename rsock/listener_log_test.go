package rsock

import (
	"context"
	"io"
	"log"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// refuse sends input from a raw TCP client to ln (nothing: it closes at once) and
// waits until the server has closed the connection, and so logged why.
func refuse(t *testing.T, ln *Listener, input string) {
	t.Helper()
	c := dialRaw(t, ln)
	if input != "" {
		_, err := c.Write([]byte(input))
		require.NoError(t, err)
	}
	c.(*net.TCPConn).CloseWrite()
	io.ReadAll(c) // until the server closes (or resets) it
}

// TestListenerLogLevels: a client that speaks no rsock to a Listener without
// AcceptPlainClients is a WARN that says how to serve it; a connection that closes
// before its first byte (a health check) is only an INFO.
func TestListenerLogLevels(t *testing.T) {
	tests := []struct {
		name  string
		input string
		line  []string // expected in the last log line
	}{
		{"http", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", []string{"level=WARN", "set Config.AcceptPlainClients to serve plain TCP clients", `first bytes \"GET \" are not an rsock hello`, "remote=127.0.0.1:"}},
		{"health check", "", []string{"level=INFO", "handshake failed", "connection closed before its hello"}},
	}
	var logs logBuffer
	ln := listen(t, &Config{Logger: logs.logger()})
	for _, tt := range tests {
		refuse(t, ln, tt.input)
		line := lastLine(logs.String())
		for _, want := range tt.line {
			require.Contains(t, line, want, "log line of %s", tt.name)
		}
	}
}

// TestListenerLogsAccepted: at DEBUG, each accepted connection is logged with its
// transport and fallback reason.
func TestListenerLogsAccepted(t *testing.T) {
	var logs logBuffer
	scfg := &Config{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})), DisableSHM: true}
	// The client offers no RDMA, even where a default provider has a device.
	ln := listen(t, scfg)
	c, s := pipe(t, ln, &Config{DisableSHM: true, DisableRDMA: true})
	defer c.Close()
	defer s.Close()
	line := lastLine(logs.String())
	for _, want := range []string{"level=DEBUG", "rsock: accepted", "transport=tcp", `reason="rsock: upgrade to rdma: peer offered no RDMA"`} {
		require.Contains(t, line, want)
	}
}

// useDefaultLogger makes slog.Default write to w at every level for the rest of the
// test, and restores it (and the log package's output, which slog.SetDefault moves).
func useDefaultLogger(t *testing.T, w io.Writer) {
	old, out, flags := slog.Default(), log.Writer(), log.Flags()
	slog.SetDefault(slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() {
		slog.SetDefault(old)
		log.SetOutput(out)
		log.SetFlags(flags)
	})
}

// TestNilLoggerWarnsToDefault: a Config without a Logger logs WARN and above to
// slog.Default, as it is when the record is logged, and nothing below WARN.
func TestNilLoggerWarnsToDefault(t *testing.T) {
	var logs logBuffer
	useDefaultLogger(t, &logs)
	ln := listen(t, nil)
	refuse(t, ln, "GET / HTTP/1.1\r\n\r\n")
	require.Contains(t, logs.String(), "level=WARN")
	require.Contains(t, logs.String(), "Config.AcceptPlainClients")

	h := defaultLogger().Handler()
	ctx := context.Background()
	for _, tt := range []struct {
		level slog.Level
		on    bool
	}{{slog.LevelDebug, false}, {slog.LevelInfo, false}, {slog.LevelWarn, true}, {slog.LevelError, true}} {
		require.Equal(t, tt.on, h.Enabled(ctx, tt.level), "default Logger enabled at %v", tt.level)
	}
	// Attributes and groups reach slog.Default's handler.
	var later logBuffer
	useDefaultLogger(t, &later) // a default set after the Logger was made is followed
	defaultLogger().With("a", 1).WithGroup("g").Warn("w", "b", 2)
	require.Contains(t, later.String(), "level=WARN msg=w a=1 g.b=2")
	require.False(t, strings.Contains(later.String(), "INFO"))
}
