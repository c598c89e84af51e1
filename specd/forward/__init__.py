"""The forward path: the target model and everything that runs its passes.

- :mod:`.target`: :class:`~specd.forward.target.Target`, the model behind the engine
  (prefill, decode and verify passes over a :class:`~specd.kvcache.KVCache`).
- :mod:`.fastpath`: the lean forward of a Llama-style decoder over the model's weights.
- :mod:`.compiled`: the one-token and verify step, run by one
  :class:`~specd.forward.compiled.StepBackend` chosen at load.
- :mod:`.decode_step` and :mod:`.cpu_kernels`: the native step and attention kernels
  (``csrc/``), built for the instruction set this CPU has.
- :mod:`.products`: weight-major matrix products; :mod:`.static_graph`: CUDA graphs.
- :mod:`.models`: loading a model by name or path; :mod:`.tiny`: small random models for
  tests.

Nothing here imports the engine or the plugins; the engine imports this package.
"""
