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
//
// A server already holding an rsock Listener (or wanting its address) hands it to
// [http.Server.Serve] directly; a client with its own [http.Transport] sets
// DialContext to an [rsock.Dialer]'s:
//
//	ln, err := rsock.Listen("tcp", ":8080", cfg)
//	go srv.Serve(ln)
//
//	tr := &http.Transport{DialContext: (&rsock.Dialer{Config: cfg}).DialContext}
//
// # Which transport carried a request
//
// A handler learns it from [ConnTransport] when the server's ConnContext is
// [ConnContext]; a client from its dialed connections' [rsock.Conn.Transport]:
//
//	srv := &http.Server{Handler: h, ConnContext: rsockhttp.ConnContext}
//	// in the handler:
//	log.Printf("%s %s over %s", r.Method, r.URL, rsockhttp.ConnTransport(r))
//
// [Conn] returns the [*rsock.Conn] itself, for its fallback reason and the rest:
//
//	if c := rsockhttp.Conn(r); c != nil && c.FallbackReason() != nil {
//		log.Printf("not on RDMA: %v", c.FallbackReason())
//	}
//
// # Plain clients
//
// With [rsock.Config.AcceptPlainClients], the same server also answers clients that do
// not use rsock at all, such as curl or a stock [http.Client]; their requests report
// transport "tcp".
package rsockhttp
