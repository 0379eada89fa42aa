"""What leaves a process: tenant payloads and checkpoints, and exports of a tenant into
another project's format.

* :mod:`~joynexus.models.checkpoints.payload`: payloads between services, checkpoints
  on disk (manifest, atomic writes, resume);
* :mod:`~joynexus.models.checkpoints.tenant_export`: what every export reads of a tenant
  checkpoint;
* :mod:`~joynexus.models.checkpoints.pi0_export`: a ``pi0_expert`` tenant as a complete
  π0 checkpoint; :mod:`~joynexus.models.checkpoints.lerobot_export`: a
  ``smolvla_expert`` tenant as a LeRobot policy directory (a ``pi0_expert`` or
  ``pi05_expert`` one on a LeRobot π checkpoint:
  :mod:`~joynexus.models.checkpoints.lerobot_pi_export`).
"""
