// Package rsockhttp runs net/http servers and clients over rsock connections.
//
// It does not wrap or re-implement net/http: a server is an ordinary [http.Server] whose
// Serve is handed an rsock Listener, and a client is an ordinary [http.Client] whose
// Transport dials through an [rsock.Dialer]. Graceful shutdown, keep-alives, timeouts
// and everything else are net/http's own.
//
// The package lives in the http/ directory of the module but is named rsockhttp, so that
// it can be imported next to net/http without an alias.
//
// # Usage
//
//	srv := &http.Server{Addr: ":8080", Handler: mux}
//	go rsockhttp.ListenAndServe(srv, cfg)  // returns http.ErrServerClosed after srv.Shutdown
//
//	client := rsockhttp.NewClient(cfg)
//	resp, err := client.Get("http://server:8080/")
package rsockhttp
