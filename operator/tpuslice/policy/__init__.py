"""TPUSlicePolicy, the admin policy of a shared cluster, as pure rules: a policy object
parsed into frozen records, which policies govern a namespace, and every decision
(refusals, the priority an object queues at, the pools a namespace may use, its usage
limits) as data the shell acts on.
"""
