"""The identity admission webhook: the admission decision, its HTTPS server, its
configuration and the certificates every replica shares.
"""
