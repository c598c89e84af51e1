"""The specd language server: ghost-text and completion items from a local model.

``specd serve --stdio`` runs it for an editor; see docs/editors.md. Modules:

- protocol: ``server`` (LSP handlers), ``answers`` (results as LSP answers), ``convert``
  (LSP types), ``rpc`` (message checking), ``daemon`` (stdio and TCP), ``client`` (the
  CLI's client of a daemon);
- what a session holds: ``documents``, ``workspace`` (the drafting index), ``warmup``
  (warm-ups, prefetches and the debounce around requests), ``cache`` (the completion
  cache), ``debounce``;
- the completion pipeline: ``completer``, ``prompting``, ``postprocess``, ``syntax``;
- what every session shares: ``service`` (the engine, loaded behind ``initialize``, and the
  generation worker), ``runner`` (that worker, for both servers), ``config``, ``metrics``;
- other ways to generate: ``http`` (``serve --http``), ``backend`` and ``backend_prompt``
  (``--backend``, a remote serving engine);
- commands: ``commands`` (``serve``, ``complete`` and ``stats``, added to ``specd``
  through the ``specd.commands`` entry-point group) and ``serve``.

It uses only specd's public API: the names ``specd`` exports, and ``specd.options`` (the
options and the engine builder every subcommand shares).
"""
