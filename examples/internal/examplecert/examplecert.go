// Package examplecert gives the examples a TLS certificate for rsock's QUIC fallback,
// which, QUIC being encrypted, needs one: a server loads it from PEM files, or, when
// they do not exist yet, makes a self-signed one at start and writes it there, so that
// a client can trust it by reading the same certificate file.
//
// A self-signed certificate is for trying the examples out. A real deployment uses a
// certificate from its own certificate authority, loaded the same way.
package examplecert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"time"
)

// Validity is how long a generated certificate is valid.
const Validity = 30 * 24 * time.Hour

// ServerConfig returns a TLS configuration holding the certificate of certFile and
// keyFile (PEM). When neither file exists, it makes a self-signed certificate for hosts
// (IP addresses or DNS names) and for localhost, 127.0.0.1 and ::1, writes it to the
// two files (the key readable by its owner only), and reports generated. It never
// overwrites a file: when only one of the two exists, it fails.
func ServerConfig(certFile, keyFile string, hosts ...string) (cfg *tls.Config, generated bool, err error) {
	_, certErr := os.Stat(certFile)
	_, keyErr := os.Stat(keyFile)
	switch {
	case errors.Is(certErr, fs.ErrNotExist) && errors.Is(keyErr, fs.ErrNotExist):
		if err := generate(certFile, keyFile, hosts); err != nil {
			return nil, false, err
		}
		generated = true
	case errors.Is(certErr, fs.ErrNotExist) || errors.Is(keyErr, fs.ErrNotExist):
		return nil, false, fmt.Errorf("examplecert: one of %s and %s exists and not the other: remove it to generate both, or give both", certFile, keyFile)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, false, fmt.Errorf("examplecert: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}}, generated, nil
}

// ClientConfig returns a TLS configuration that trusts the certificates in caFile
// (PEM): for a self-signed server certificate, the server's certificate file itself.
func ClientConfig(caFile string) (*tls.Config, error) {
	b, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("examplecert: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("examplecert: no PEM certificate in %s", caFile)
	}
	return &tls.Config{RootCAs: pool}, nil
}

// generate writes a self-signed certificate for hosts, localhost, 127.0.0.1 and ::1 to
// certFile, and its key to keyFile.
func generate(certFile, keyFile string, hosts []string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("examplecert: key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return fmt.Errorf("examplecert: serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "rsock example"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(Validity),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true, // self-signed: it is its own authority
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			if !ip.IsUnspecified() {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			}
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("examplecert: certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("examplecert: key: %w", err)
	}
	if err := writePEM(keyFile, "PRIVATE KEY", keyDER, 0o600); err != nil {
		return err
	}
	return writePEM(certFile, "CERTIFICATE", der, 0o644)
}

// writePEM writes one PEM block to a new file name.
func writePEM(name, typ string, der []byte, perm fs.FileMode) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("examplecert: %w", err)
	}
	err = pem.Encode(f, &pem.Block{Type: typ, Bytes: der})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("examplecert: write %s: %w", name, err)
	}
	return nil
}
