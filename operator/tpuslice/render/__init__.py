"""Rendering (pure): a parsed spec as the KubeRay object it becomes, and a TPU pod's
identity (the env and hostnames the admission webhook sets).
"""
