-- Argo CD health check for tpuslice.dev/TPUSliceService.
--
-- Install as resource.customizations.health.tpuslice.dev_TPUSliceService in
-- argocd-cm (see README "Install with Argo CD"). Ready (traffic served by a
-- cluster whose every slice is ready on its reserved node pool) is Healthy,
-- also while an upgrade prepares a new cluster (the message says how far it
-- is, e.g. UpgradeWaitingForCapacity); Stalled is Degraded; anything else is
-- Progressing. Conditions are trusted only for the object's current
-- generation. Plain Lua 5.1 (Argo CD's gopher-lua); tested by
-- tests/unit/test_gitops_health.py.

local function condition(conditions, kind)
  if conditions == nil then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function describe(c, fallback)
  if c == nil then
    return fallback
  end
  local text = c.reason or ""
  if c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end

local hs = {status = "Progressing", message = "Waiting for the operator to report status"}
if obj.status == nil or obj.status.conditions == nil then
  return hs
end

local generation = obj.metadata.generation
local conditions = obj.status.conditions
local function current(c)
  return c ~= nil and (c.observedGeneration == nil or c.observedGeneration == generation)
end

local ready = condition(conditions, "Ready")
local stalled = condition(conditions, "Stalled")
local reconciling = condition(conditions, "Reconciling")
local upgrade = condition(conditions, "UpgradeInProgress")
local observed = obj.status.observedGeneration

if observed ~= nil and observed ~= generation then
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end
if current(stalled) and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(stalled, "Stalled")
  return hs
end
if current(ready) and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready, "Ready")
  if current(upgrade) and upgrade.status == "True" then
    hs.message = hs.message .. "; " .. describe(upgrade, "UpgradeInProgress")
  end
  return hs
end
if current(ready) then
  hs.message = describe(ready, "Not ready")
elseif current(reconciling) then
  hs.message = describe(reconciling, "Reconciling")
end
return hs
