"""The planner (pure): which capacity units exist, which are free, which slice claims
which, gangs, the per-shape queue and the orphan-sweep rule.
"""
