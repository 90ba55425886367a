package main

// The image (make image) holds no CA bundle, and some hosts have none:
// where the system has no certificate roots, TLS verified against them
// (rediss:// without --redis-tls-ca, tracing over HTTPS) uses Mozilla's,
// built in. Where the system has roots, they are used and these are not.
import _ "golang.org/x/crypto/x509roots/fallback"
