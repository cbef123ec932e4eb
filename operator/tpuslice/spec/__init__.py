"""Parsing, validating and defaulting the three kinds' specs, and judging pod-template
overrides against KubeRay's schema (pure: errors name the field).
"""
