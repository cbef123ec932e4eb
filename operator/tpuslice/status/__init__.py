"""Status (pure): what a pass saw as conditions, slice states and bounded messages, for
each kind.
"""
