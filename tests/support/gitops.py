"""How GitOps tools judge a TPUSliceCluster: Argo CD's Lua check and kstatus's rules.

``argocd_health`` runs docs/gitops/argocd-health.lua in a real Lua VM (lupa),
as Argo CD runs it in gopher-lua: the object goes in as Lua tables, ``hs``
comes out. ``kstatus`` is the documented kstatus algorithm for a custom
resource (what Flux's ``wait``/``healthChecks`` and ``kstatus``-based tools
compute), written from its documentation rather than imported: there is no
Python port, and the rules are short:

1. ``metadata.deletionTimestamp`` set: Terminating.
2. ``status.observedGeneration`` present and not ``metadata.generation``: InProgress.
3. condition ``Reconciling`` True: InProgress.
4. condition ``Stalled`` True: Failed.
5. condition ``Ready`` present and not True: InProgress (Flux and most kstatus
   readers also treat a not-True Ready as not ready).
6. otherwise: Current.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ARGOCD_LUA = ROOT / "docs" / "gitops" / "argocd-health.lua"


def _to_lua(lua: Any, value: Any) -> Any:
    if isinstance(value, dict):
        return lua.table_from({k: _to_lua(lua, v) for k, v in value.items()})
    if isinstance(value, list):
        return lua.table_from([_to_lua(lua, v) for v in value])
    return value


def argocd_health(obj: dict[str, Any], script: Path = ARGOCD_LUA) -> dict[str, str]:
    """``{"status": ..., "message": ...}`` as Argo CD would show it for ``obj``."""
    import lupa  # type: ignore[import-untyped]

    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    function = lua.eval(
        "function(source, obj) return load(source, 'health', 't', {"
        "ipairs = ipairs, pairs = pairs, tostring = tostring, obj = obj})() end"
    )
    result = function(script.read_text(), _to_lua(lua, obj))
    return {"status": str(result["status"]), "message": str(result["message"] or "")}


def kstatus(obj: dict[str, Any]) -> str:
    """kstatus's verdict for a custom resource: Current, InProgress, Failed or Terminating."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "Terminating"
    observed = status.get("observedGeneration")
    if observed is not None and observed != meta.get("generation"):
        return "InProgress"
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    if (conditions.get("Reconciling") or {}).get("status") == "True":
        return "InProgress"
    if (conditions.get("Stalled") or {}).get("status") == "True":
        return "Failed"
    ready = conditions.get("Ready")
    if ready is not None and ready.get("status") != "True":
        return "InProgress"
    return "Current"
