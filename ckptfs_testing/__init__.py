"""Test tooling for ckptfs; not part of the product (not in the wheel).

* :mod:`ckptfs_testing.modelcheck` - the power-loss model checker
* :mod:`ckptfs_testing.mc_workloads` - its workloads and the known-bad protocol variants
* :mod:`ckptfs_testing.faults` - ``FaultyStore``, the fault-injecting backing store
* :mod:`ckptfs_testing.mount` - ``Mount``, real ckptfs mounts started and stopped by PID
* :mod:`ckptfs_testing.lineserver` - ``LineServer``, client of the fork servers in ``tests/workloads``

Used by ``tests/``, ``campaigns/``, ``bench/`` and ``scripts/`` from a source checkout;
``tests/test_packaging.py`` checks that the wheel leaves it out.
"""
