"""The shell that acts: the pass, its parts (applier, slice actuator, status writer,
expectations, queue) and the kopf handlers that drive it. The only package that writes
to the API server on the pass's behalf.
"""
