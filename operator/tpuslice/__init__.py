"""tpuslice-operator: TPUSliceCluster -> KubeRay RayCluster with whole-slice TPU scheduling."""

__version__ = "0.1.0"
