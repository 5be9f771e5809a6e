package examplecert

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// handshake runs a TLS handshake between server and client over loopback TCP (whose
// buffers, unlike net.Pipe's, let both sides write at once, as a failing client does
// with its alert), the client expecting serverName.
func handshake(t *testing.T, server, client *tls.Config, serverName string) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		tls.Server(c, server).Handshake() // fails when the client gives up
		c.Close()
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	client = client.Clone()
	client.ServerName = serverName
	err = tls.Client(a, client).Handshake()
	a.Close()
	<-done
	return err
}

func TestGenerateThenLoad(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	scfg, generated, err := ServerConfig(certFile, keyFile, "10.1.2.3", "server.example", "0.0.0.0", "")
	require.NoError(t, err)
	require.True(t, generated, "first call generates")
	st, err := os.Stat(keyFile)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "key file mode")

	again, generated, err := ServerConfig(certFile, keyFile)
	require.NoError(t, err)
	require.False(t, generated, "second call loads")
	require.Equal(t, scfg.Certificates[0].Certificate, again.Certificates[0].Certificate)

	ccfg, err := ClientConfig(certFile)
	require.NoError(t, err)
	tests := []struct {
		name string
		ok   bool
	}{
		{"127.0.0.1", true}, {"::1", true}, {"localhost", true}, {"10.1.2.3", true},
		{"server.example", true}, {"other.example", false}, {"10.9.9.9", false},
	}
	for _, tt := range tests {
		err := handshake(t, scfg, ccfg, tt.name)
		if tt.ok {
			require.NoError(t, err, "handshake as %s", tt.name)
		} else {
			require.Error(t, err, "handshake as %s", tt.name)
		}
	}
}

func TestErrors(t *testing.T) {
	dir := t.TempDir()
	only := filepath.Join(dir, "only.pem")
	require.NoError(t, os.WriteFile(only, []byte("x"), 0o600))
	_, _, err := ServerConfig(only, filepath.Join(dir, "missing.pem"))
	require.ErrorContains(t, err, "exists and not the other")
	_, _, err = ServerConfig(only, only)
	require.ErrorContains(t, err, "examplecert:")
	_, err = ClientConfig(only)
	require.ErrorContains(t, err, "no PEM certificate in")
	_, err = ClientConfig(filepath.Join(dir, "missing.pem"))
	require.ErrorContains(t, err, "no such file")
}
