"""`make bench [SCALE=small|medium|large]`: the operator next to KubeRay on the local cluster.

One run, one local simulated GKE cluster (etcd, kube-apiserver, scheduler,
controller-manager, KWOK, KubeRay), one fake v6e 4x4 node pool (4 nodes) per
TPUSliceCluster plus CPU nodes for the heads. In order:

  f. floor: create+delete ConfigMaps one at a time (bare API-server write latency);
  operator run: `tpuslice run --webhook-port=0` and `tpuslice webhook` (the admission
     webhooks in a process of their own, as the chart runs them) as separate
     processes, each with --metrics-port; every
     TPUSliceCluster (v6e 4x4, one slice) is created at once from a thread pool;
     watches (raw JSON lines, receive time taken on this machine's monotonic
     clock) record when each RayCluster, each pod, each release and each Ready
     condition was seen:
     a. TSC created -> RayCluster seen, next to KubeRay's RayCluster seen ->
        first pod seen, and the ratio of the two;
     b. last pod of a slice seen -> every pod of the slice seen ungated and pinned;
     c. first create -> every TSC Ready;
     e. then 60 s of steady state: the operator's API writes (POST/PUT/PATCH/DELETE from its
        /metrics, the leader's Lease renewals left out) and the TSC / SliceReservation /
        Event changes seen by watches;
     d. the operator's peak RSS (VmHWM) and CPU seconds from /proc, and the
        webhook process's;
     g. then a restart: the operator stopped and started again over the same
        clusters; seconds until healthy and until every cluster had a pass (its
        tpuslice_slices gauge is full), and its writes until then plus 30 s (the
        webhook configuration apply at start is the webhook process's, not counted);
  direct run: the operator stopped and its webhook configuration deleted, the
     same RayClusters (rendered beforehand by `tpuslice render`, reservation policy
     None, so no gate) created directly; c. compares first create -> every RayCluster
     ready;
  gang run: h. gang completion time for multislice clusters under contention: the
     operator started again, G 2-slice TPUSliceClusters (v6e 2x4 on 4-chip hosts,
     gang AllSlices by default) created at once over P < 2G free v6e 2x4 pools, so
     at most P/2 gangs run at a time and the rest wait in the shape's queue; each
     gang is deleted as soon as it is Ready (released in turn), freeing its pools for
     the next. Per gang: first pod seen -> the gang's last slice seen released (all
     its pods ungated and pinned), p50/p99, which includes its time in the queue;
     first create -> every gang has been Ready; the spread between a gang's first
     and last slice released; the longest time a gang held some but not all of its
     pools with no pod released (from a watch on SliceReservations).

Both the operator run and the direct run also record a per-cluster timeline
(tpusim.benchstats.OPERATOR_MILESTONES: created, RayCluster seen, first and last
pod seen, reservation seen, last worker ungated and pinned, last pod scheduled,
last pod Ready, RayCluster ready, TSC Ready), printed as p50/p99 per milestone
since the cluster was created ("at") and since its previous milestone ("step"),
with the raw times in the run's folder (timeline-operator.json,
timeline-direct.json). The operator run adds: the identity webhook's admission
latency during the pod burst (p50/p99 from the
tpuslice_webhook_admission_duration_seconds buckets scraped before the first create
and after all Ready), status patches per cluster on the way to Ready (the operator's
PATCH tpusliceclusters/status count / clusters, and per cluster the status changes
and MODIFIED events its watch saw), and KubeRay's RayCluster -> first pod in the
operator run over the direct run's. With --profile[=HZ] py-spy samples the operator
from the first create until all Ready (profile-operator.txt: raw collapsed stacks,
which speedscope opens; profile-operator-summary.txt: CPU by thread, by module,
JSON decoding, top functions), and the restarted operator from healthy until every
object had a pass (profile-restart.txt and its summary).

With --pin-at-admission the operator and its webhook run with that setting
(results-<scale>-pinned.json, "pinned": true, left out of the plot).

The large scale runs the operator with --status-batch-seconds=60 (the results say
"status_batch_seconds"): a slice's steps lie tens of seconds apart there, and the
operator's docs give that setting for a burst of that size. --status-batch-seconds N
sets it for any scale (0: the operator's default).

Prints a table and writes .bench/results-<scale>.json, then redraws
.bench/bench-scaling.svg from every results-<scale>.json present (`make bench-plot`
draws docs/bench-scaling.svg). Every wait is bounded; a phase that times out is
reported with what it reached, and the run goes on. Not part of `make test`.

Run as `python hack/bench [--scale ...]` (the folder hack/bench: its __main__.py).
The benchmark never imports the operator: it starts the operator and renders
RayClusters with the `tpuslice` command, and names the operator's API from
bench.operator_api.

Modules: cli (flags), runs (the phases and the run), scenario (scales, objects,
pools), watches (watches and recorders), measure (figures from /metrics, the
recorders, py-spy), cluster (namespaces, pools, waits, deletes), report (the
table), plot (the figures against scale).
"""
