"""The Talos API client: our .proto files at Talos field numbers, stubs generated from them, the
mutual-TLS transport (grpcio cannot do Ed25519, so TLS runs through OpenSSL), retries and errors, and
the operations the providers and day-two code call (apply, bootstrap, kubeconfig, upgrade, reset, etcd).
"""
