package certs

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
	"math/big"
	"net"
	"time"
)

// This file makes a development PKI: a CA and the node and client
// certificates it signs (`lockd cert`, and the tests). ECDSA P-256 keys,
// PEM files, nothing else: a production PKI (Vault, cert-manager, an
// internal CA) produces files of the same shape.

// Kind says what a certificate Issue makes is for.
type Kind int

const (
	// Node is a cluster member's certificate: it serves the API and Raft
	// (server auth, with the node's names and addresses as SANs) and
	// authenticates the node to its peers (client auth).
	Node Kind = iota
	// Client is a client's certificate (client auth only); its common name
	// is the client's identity.
	Client
)

// PEM is a certificate and its private key, PEM-encoded.
type PEM struct {
	// Cert is the certificate ("CERTIFICATE" block).
	Cert []byte
	// Key is the private key ("PRIVATE KEY" block, PKCS #8).
	Key []byte
}

// NewCA makes a self-signed certificate authority named name, valid from
// now (less a minute, for clocks slightly behind) for valid.
func NewCA(name string, valid time.Duration) (PEM, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return PEM{}, fmt.Errorf("generate key: %w", err)
	}
	tmpl, err := template(name, valid)
	if err != nil {
		return PEM{}, err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.MaxPathLenZero = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return PEM{}, fmt.Errorf("create ca certificate: %w", err)
	}
	return encode(der, key)
}

// Issue makes a certificate for name signed by ca. A Node certificate
// carries hosts (IP addresses or DNS names) as SANs, which is what clients
// and peers check the address they dialled against; a Client certificate
// needs none.
func Issue(ca PEM, kind Kind, name string, hosts []string, valid time.Duration) (PEM, error) {
	pair, err := tls.X509KeyPair(ca.Cert, ca.Key)
	if err != nil {
		return PEM{}, fmt.Errorf("ca: %w", err)
	}
	caCert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return PEM{}, fmt.Errorf("ca: %w", err)
	}
	if !caCert.IsCA {
		return PEM{}, errors.New("ca: the certificate is not a CA")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return PEM{}, fmt.Errorf("generate key: %w", err)
	}
	tmpl, err := template(name, valid)
	if err != nil {
		return PEM{}, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if kind == Node {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else if h != "" {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, pair.PrivateKey)
	if err != nil {
		return PEM{}, fmt.Errorf("create certificate: %w", err)
	}
	return encode(der, key)
}

func template(name string, valid time.Duration) (*x509.Certificate, error) {
	if valid <= 0 {
		return nil, fmt.Errorf("validity %v must be positive", valid)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial: %w", err)
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(valid),
	}, nil
}

func encode(der []byte, key *ecdsa.PrivateKey) (PEM, error) {
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return PEM{}, fmt.Errorf("encode key: %w", err)
	}
	return PEM{
		Cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}),
	}, nil
}
