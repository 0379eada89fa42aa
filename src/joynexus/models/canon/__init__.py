"""Canonicalization: many tenants' observation batches → one backbone input.

* :mod:`~joynexus.models.canon.canonicalize`: the canonical prototype
  (:class:`~joynexus.models.canon.canonicalize.CanonicalSpec`), resize-with-pad, the
  processor path (the reference);
* :mod:`~joynexus.models.canon.tensor`: the same inputs as batched tensor ops (default);
* :mod:`~joynexus.models.canon.feature`: the :class:`~joynexus.models.canon.feature.
  VLAFeature` a canonicalization produces and its slice table.
"""
