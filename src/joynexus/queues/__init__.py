"""The two logical queues of the control plane (paper Appendix A.1, Table 2).

* :mod:`joynexus.queues.training` — the Training Queue: partitions of training samples
  with the two-step ``get_meta`` / ``get_data`` interface (storage backends in
  :mod:`joynexus.queues.storage`).
* :mod:`joynexus.queues.inference` — the Inference Queue and its group-batching
  scheduler (requests in :mod:`joynexus.queues.request`).

Import the submodule you need: the Inference Queue does not pull in torch.
"""
