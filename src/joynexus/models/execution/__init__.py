"""Running many tenants on one backbone forward.

* :mod:`~joynexus.models.execution.grouped`: the grouped executor (predict requests,
  the shared forward, slots and their memory);
* :mod:`~joynexus.models.execution.grouped_step`: one grouped training step (with the
  data-parallel gradient hook);
* :mod:`~joynexus.models.execution.decode`: decoding a forward's rows, heads of one
  architecture stacked.
"""
