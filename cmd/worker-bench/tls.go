package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// benchCert makes a self-signed ECDSA P-256 certificate for 127.0.0.1, valid for a
// day, and writes cert.pem and key.pem into dir. The demo upstream serves wss://
// with it; the worker trusts it through SSL_CERT_FILE=cert.pem, Go's standard
// override of the system root pool on Linux, which the bench sets on the worker
// process alone: the worker has no setting of its own for it.
func benchCert(dir string) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "worker-bench upstream"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// tlsUpstream starts the demo upstream serving wss:// too, and returns it with the
// wss address.
func (b *bench) tlsUpstream() (*proc, string, error) {
	p, err := b.upstreamArgs(0, 64, "-tls-addr", "127.0.0.1:0", "-tls-cert", b.cert, "-tls-key", b.key)
	if err != nil {
		return nil, "", err
	}
	if p.tlsAddr == "" {
		p.stop()
		return nil, "", fmt.Errorf("demo upstream printed no wss address")
	}
	return p, p.tlsAddr, nil
}
