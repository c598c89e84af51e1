"""The specd language server: ghost-text and completion items from a local model.

``specd serve --stdio`` runs it for an editor; see docs/editors.md. Modules: ``server``
(LSP handlers), ``rpc`` (message checking), ``daemon`` (stdio and TCP), ``documents``,
``prompting``, ``postprocess``, ``workspace``, ``completer`` (the pipeline), ``scheduler``
(the generation worker), ``config``, ``metrics``, ``convert``, ``client``, ``commands``.
It uses only specd's public core.
"""
