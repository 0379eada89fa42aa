"""Front processes: HTTP decoding and encoding outside the model process.

``joynexus serve --front-procs N`` (default: the usable cores less one, at least 1;
0: one process does everything) runs N front processes on the public port
(:mod:`.worker`, :mod:`.app`): they parse, authenticate-forward, validate and decode
``predict`` requests and hand the observation tensors to the model process through
shared memory (:mod:`.channel`, :mod:`.hub`), which only batches and runs the device.
Every other route is forwarded to the model process's loopback server unchanged.
:mod:`.supervisor` starts them and restarts one that dies. None of this imports torch.
"""
