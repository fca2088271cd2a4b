"""Synthetic workloads from TOML profiles (``profiles/workloads``; docs/profiles.md).

API: :func:`generate` (profile -> event file, returns :class:`kvsim.events.import_summary.ImportSummary`),
:func:`build_workload` (profile -> Request table), :func:`load_profile`,
:func:`list_profiles`.
"""

from kvsim.spec.workload_profile import RequestClass, WorkloadProfile, list_profiles, load_profile
from kvsim.workload.generator import build_workload, generate

__all__ = ["RequestClass", "WorkloadProfile", "build_workload", "generate", "list_profiles",
           "load_profile"]
