"""The forward path: the target model and everything that runs its passes.

- :mod:`.target`: :class:`~specd.forward.target.Target`, the model behind the engine
  (prefill, decode and verify passes over a :class:`~specd.kvcache.KVCache`); :mod:`.passes`:
  how a prefill is cut into passes and a token tree masked.
- :mod:`.fastpath`: the lean forward of a Llama-style decoder over the model's weights;
  :mod:`.architectures`: the models it runs.
- :mod:`.step` and :mod:`.compiled`: the one-token and verify step, run by one
  :class:`~specd.forward.step.StepBackend` chosen at load; :mod:`.pricing`: what verify
  passes cost on this host, for the exit policy.
- :mod:`.decode_step`, :mod:`.cpu_kernels` and :mod:`.kernel_build`: the native step and
  attention kernels (``csrc/``), built for the instruction set this CPU has.
- :mod:`.lean_model` and :mod:`.tokenizer`: a checkpoint the lean forward serves, loaded
  without building a transformers model.
- :mod:`.products`: weight-major matrix products; :mod:`.static_graph`: CUDA graphs.
- :mod:`.models`: loading a model by name or path (:mod:`.gguf_models`: GGUF files as
  models, by alias or path); :mod:`.weights`: how its matrices are
  stored (``--weights``); :mod:`.blocks`, :mod:`.block_formats` and :mod:`.gguf_file`:
  weights kept as GGUF's quantized blocks, and reading GGUF files; :mod:`.tiny`: small
  random models for tests.

Nothing here imports the engine or the plugins; the engine imports this package.
"""
