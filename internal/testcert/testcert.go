// Package testcert makes a self-signed TLS certificate for tests and benchmarks that need
// TLS on loopback, such as rsock's QUIC fallback.
//
// The key and certificate are generated once per process, in memory; nothing is read
// from or written to disk. The certificate is valid for "localhost", 127.0.0.1 and ::1.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"sync"
	"time"
)

var (
	once   sync.Once
	cert   tls.Certificate
	pool   *x509.CertPool
	genErr error
)

func generate() {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		genErr = err
		return
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		genErr = err
		return
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "rsock test"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		genErr = err
		return
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		genErr = err
		return
	}
	cert = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	pool = x509.NewCertPool()
	pool.AddCert(leaf)
}

// Configs returns a server configuration holding the certificate and a client
// configuration that trusts it. Each call returns fresh copies the caller may modify.
func Configs() (server, client *tls.Config, err error) {
	once.Do(generate)
	if genErr != nil {
		return nil, nil, genErr
	}
	server = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
	client = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
	return server, client, nil
}
