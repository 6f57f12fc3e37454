package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
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

// statusServerDNSName is the host name the Trainer writes into the pods' status URL
// (<webhook service>.<operator namespace>.svc with its defaults); the serving
// certificate names it so that a client that reaches 127.0.0.1 can verify it.
const statusServerDNSName = "kubeflow-trainer-controller-manager.kubeflow-system.svc"

// certificates: a CA made at start and a serving certificate for 127.0.0.1 signed by it.
type certificates struct {
	caPEM   []byte
	certPEM []byte
	keyPEM  []byte
}

// newCertificates returns the CA and serving certificate in dir (ca.crt, tls.crt and
// tls.key, the file names controller-runtime's webhook server reads): those a previous
// start of this process left there, so that a restart does not change the CA the API
// server trusts for the webhooks, or else new ones.
func newCertificates(dir string) (*certificates, error) {
	if c, err := loadCertificates(dir); err == nil {
		return c, nil
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kfp-trainer test controllers CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost", statusServerDNSName},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	c := &certificates{
		caPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	for name, data := range map[string][]byte{"ca.crt": c.caPEM, "tls.crt": c.certPEM, "tls.key": c.keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", name, err)
		}
	}
	return c, nil
}

func loadCertificates(dir string) (*certificates, error) {
	c := &certificates{}
	for name, dst := range map[string]*[]byte{"ca.crt": &c.caPEM, "tls.crt": &c.certPEM, "tls.key": &c.keyPEM} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		*dst = data
	}
	pair, err := tls.X509KeyPair(c.certPEM, c.keyPEM)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(c.caPEM) {
		return nil, fmt.Errorf("no CA in %s", dir)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: statusServerDNSName}); err != nil {
		return nil, err
	}
	return c, nil
}
