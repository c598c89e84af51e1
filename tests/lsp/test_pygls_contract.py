"""What of pygls the language server relies on beyond its documented use, as listed in
lsp/rpc.py's docstring: each test fails when a pygls release changes one of them, before
a session misbehaves in an editor."""

from __future__ import annotations

import inspect

import pygls.protocol
from lsprotocol import types
from pygls.protocol import LanguageServerProtocol
from specd.lsp.handlers import COMPLETE_METHOD, STATS_METHOD, build_server
from specd.lsp.rpc import SpecdProtocol, TextPositionRequest
from specd.lsp.server import SpecdServer
from specd.lsp.service import Service

#: the builtin handlers SpecdProtocol overrides, by attribute name -> LSP method
OVERRIDDEN = {
    "lsp_exit": types.EXIT,
    "lsp_text_document__did_open": types.TEXT_DOCUMENT_DID_OPEN,
    "lsp_text_document__did_change": types.TEXT_DOCUMENT_DID_CHANGE,
    "lsp_text_document__did_close": types.TEXT_DOCUMENT_DID_CLOSE,
}


def test_the_protocol_constructor_takes_the_server_and_a_converter():
    params = list(inspect.signature(LanguageServerProtocol.__init__).parameters)
    assert params == ["self", "server", "converter"]


def test_the_overridden_builtins_exist_under_the_same_names_and_methods():
    """An override of a name pygls no longer has would register a second handler for the
    method, and which one runs would be chance."""
    for name, method in OVERRIDDEN.items():
        theirs = getattr(LanguageServerProtocol, name, None)
        assert theirs is not None, f"pygls has no {name}"
        assert getattr(theirs, "method_name", None) == method, name
        assert getattr(SpecdProtocol, name).method_name == method


def test_the_overrides_are_the_ones_registered():
    service = Service(None)
    try:
        protocol = build_server(service).protocol
        builtin = protocol.fm.builtin_features
        for name, method in OVERRIDDEN.items():
            assert builtin[method].__func__ is getattr(SpecdProtocol, name), method
    finally:
        service.load_failed(RuntimeError("not loaded in this test"))
        service.close()


def test_registered_handlers_are_found_in_fm_features():
    service = Service(None)
    try:
        server = build_server(service)
        features = server.protocol.fm.features
        for method in (
            types.TEXT_DOCUMENT_DID_OPEN,
            types.TEXT_DOCUMENT_DID_CHANGE,
            types.TEXT_DOCUMENT_DID_CLOSE,
            types.TEXT_DOCUMENT_INLINE_COMPLETION,
            types.TEXT_DOCUMENT_COMPLETION,
            COMPLETE_METHOD,
            STATS_METHOD,
        ):
            assert callable(features.get(method)), method
        assert SpecdServer(service).protocol.fm.features == {}  # only build_server registers
    finally:
        service.load_failed(RuntimeError("not loaded in this test"))
        service.close()


def test_the_message_types_for_untyped_methods_are_public_and_take_our_fields():
    for name in ("JsonRPCRequestMessage", "JsonRPCNotification"):
        cls = getattr(pygls.protocol, name)
        fields = set(inspect.signature(cls).parameters)
        assert {"method", "jsonrpc", "params"} <= fields, name
    assert "id" in inspect.signature(pygls.protocol.JsonRPCRequestMessage).parameters


def test_typed_methods_are_structured_with_the_converter_pygls_hands_over():
    service = Service(None)
    try:
        protocol = build_server(service).protocol
        assert isinstance(protocol, SpecdProtocol)
        assert protocol.get_message_type(types.INITIALIZE) is types.InitializeRequest
        message = protocol.converter.structure(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": COMPLETE_METHOD,
                "params": {
                    "textDocument": {"uri": "file:///a.py"},
                    "position": {"line": 0, "character": 1},
                },
            },
            TextPositionRequest,
        )
        assert message.params.position.character == 1
    finally:
        service.load_failed(RuntimeError("not loaded in this test"))
        service.close()


def test_the_public_methods_the_protocol_calls_keep_their_signatures():
    """Public, yet called from our own message loop rather than pygls': a rename would show
    only when a message arrives."""
    from pygls.lsp.server import LanguageServer

    expected = {
        (LanguageServerProtocol, "handle_message"): ["self", "message"],
        (LanguageServerProtocol, "structure_message"): ["self", "data"],
        (LanguageServerProtocol, "get_message_type"): ["self", "method"],
        (LanguageServerProtocol, "set_writer"): ["self", "writer", "include_headers"],
        (LanguageServer, "report_server_error"): ["self", "error", "source"],
    }
    for (cls, name), params in expected.items():
        assert list(inspect.signature(getattr(cls, name)).parameters) == params, name
    service = Service(None)
    try:
        assert build_server(service).protocol.writer is None  # set_writer sets it
    finally:
        service.load_failed(RuntimeError("not loaded in this test"))
        service.close()
