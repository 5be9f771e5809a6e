package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/examples/internal/exampletest"
	rsockhttp "github.com/rsockio/rsock/http"
	"github.com/rsockio/rsock/rsock"
	"github.com/rsockio/rsock/verbs/soft"
)

func TestMain(m *testing.M) {
	exampletest.VerifyTestMain(m)
}

// TestServer serves an rsock client over soft RDMA and a plain net/http client over
// TCP from one Listener, as main does (but on a port of the kernel's choosing).
func TestServer(t *testing.T) {
	fab := soft.New(soft.Options{})
	ln, err := rsock.Listen("tcp", "127.0.0.1:0", &rsock.Config{Provider: fab, AcceptPlainClients: true})
	require.NoError(t, err)
	var logs exampletest.Log
	srv := newServer("", logs.Logger())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	url := "http://" + ln.Addr().String()

	rsockClient := rsockhttp.NewClient(&rsock.Config{Provider: fab})
	defer rsockClient.CloseIdleConnections()
	plainTransport := &http.Transport{}
	defer plainTransport.CloseIdleConnections()
	plainClient := &http.Client{Transport: plainTransport}

	for _, tt := range []struct {
		name   string
		client *http.Client
		want   string
	}{
		{"rsock", rsockClient, "rdma"},
		{"plain", plainClient, "tcp"},
	} {
		resp, err := tt.client.Get(url)
		require.NoError(t, err, tt.name)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err, tt.name)
		require.Equal(t, "hello from rsock over "+tt.want+"\n", string(body), tt.name)

		data := bytes.Repeat([]byte(tt.name), 1<<18)
		resp, err = tt.client.Post(url+"/sha256", "application/octet-stream", bytes.NewReader(data))
		require.NoError(t, err, tt.name)
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err, tt.name)
		require.Equal(t, fmt.Sprintf("%d %x\n", len(data), sha256.Sum256(data)), string(body), tt.name)
	}

	require.NoError(t, srv.Shutdown(t.Context()))
	require.ErrorIs(t, <-served, http.ErrServerClosed)
	require.Contains(t, logs.String(), "GET / over rdma\n")
	require.Contains(t, logs.String(), "GET / over tcp\n")
}
