"""The domain: records the pure core passes around, TPU topology, and every name, label and
Event reason the operator uses, once. Imports nothing else of the operator.
"""
