-- Argo CD health check for tpuslice.dev/TPUSliceJob.
--
-- Install as resource.customizations.health.tpuslice.dev_TPUSliceJob in argocd-cm
-- (see README "Install with Argo CD"). Reads the conditions the operator writes
-- (Complete and Failed as a Kubernetes Job has them, kstatus's Reconciling and
-- Stalled, Suspended), and trusts them only for the object's current
-- generation. A job that succeeded is Healthy, one that failed (or was
-- stopped) is Degraded, one on its way (waiting for capacity, starting,
-- running, retrying) is Progressing. Plain Lua 5.1 (Argo CD's gopher-lua);
-- tested by tests/unit/test_gitops_health.py.

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
local function holds(kind)
  local c = condition(conditions, kind)
  if current(c) and c.status == "True" then
    return c
  end
  return nil
end

local observed = obj.status.observedGeneration
if observed ~= nil and observed ~= generation then
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end
local c = holds("Complete")
if c ~= nil then
  hs.status = "Healthy"
  hs.message = describe(c, "Complete")
  return hs
end
c = holds("Failed") or holds("Stalled")
if c ~= nil then
  hs.status = "Degraded"
  hs.message = describe(c, "Failed")
  return hs
end
c = holds("Suspended")
if c ~= nil then
  hs.status = "Suspended"
  hs.message = describe(c, "Suspended")
  return hs
end
local reconciling = condition(conditions, "Reconciling")
if current(reconciling) then
  hs.message = describe(reconciling, "Reconciling")
end
return hs
