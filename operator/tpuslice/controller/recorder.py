"""Events on a TPUSliceCluster, TPUSliceJob or TPUSliceService: what a user reads in
``kubectl describe``.

Reasons live in ``events.py``; this part only posts them, through the one
module that talks to the API server (which rate limits and never raises on a
refused event).
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuslice.model.records import ClusterRef
from tpuslice.runtime.kube import ClusterApi

__all__ = ["Recorder"]


@dataclass(frozen=True)
class Recorder:
    kube: ClusterApi

    async def normal(self, ref: ClusterRef, reason: str, message: str) -> None:
        await self.post(ref, "Normal", reason, message)

    async def warning(self, ref: ClusterRef, reason: str, message: str) -> None:
        await self.post(ref, "Warning", reason, message)

    async def post(self, ref: ClusterRef, kind: str, reason: str, message: str) -> None:
        involved = {
            "kind": ref.kind,
            "metadata": {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid},
        }
        await self.kube.post_event(involved, kind, reason, message)
