"""Capacity on demand, the pure half: one ProvisioningRequest per waiting slice.

Two phases per pass: ``constraints`` (before planning: what the planner may use)
and ``plan`` (after planning: the per-slice decisions, their writes, the releases
held back, the consume annotations and the report). ``requests`` builds the
objects and decides one slice; ``controller.capacity`` carries the writes out.
"""
