"""The process's plumbing: the API client, informers, leader election, health, metrics and
configuration. Never imports ``controller`` or ``capacity``.
"""
