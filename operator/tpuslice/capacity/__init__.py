"""Capacity on demand, the pure half: ProvisioningRequests per slice and the decision what
to ask GKE for; ``controller.provisioner`` carries it out.
"""
