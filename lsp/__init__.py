"""The specd language server: ghost-text and completion items from a local model.

``specd serve --stdio`` runs it for an editor; see docs/editors.md. Modules: ``server``
(LSP handlers), ``service`` (what every session shares), ``rpc`` (message checking),
``daemon`` (stdio and TCP), ``documents``, ``prompting``, ``postprocess``, ``workspace``,
``completer`` (the pipeline), ``scheduler`` (the generation worker), ``config``,
``metrics``, ``convert``, ``client``, ``commands`` (its subcommands, added to ``specd``
through the ``specd_register_commands`` hook).

It uses only specd's public API: the names ``specd`` exports, and ``specd.options`` (the
options and the engine builder every subcommand shares).
"""
