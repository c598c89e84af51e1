"""Nothing leaves the machine, and no model code runs unless asked for."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from specd import BadInputError
from specd.forward.models import load

NO_NETWORK = textwrap.dedent(
    """
    import socket, sys
    _connect = socket.socket.connect
    def guarded(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if isinstance(host, str) and (host.startswith("127.") or host in ("::1", "localhost")):
            return _connect(self, address)
        if self.family == socket.AF_UNIX:
            return _connect(self, address)
        raise RuntimeError(f"network access attempted: {address!r}")
    socket.socket.connect = guarded
    def no_dns(*a, **k):
        raise RuntimeError(f"DNS lookup attempted: {a[:1]!r}")
    socket.getaddrinfo = no_dns
    socket.gethostbyname = no_dns
    from specd.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
def test_generate_makes_no_network_access():
    r = subprocess.run(
        [sys.executable, "-c", NO_NETWORK, "generate", "def f(x):", "--max-tokens", "6", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "network access attempted" not in r.stderr and "DNS lookup" not in r.stderr
    assert json.loads(r.stdout)["stats"]["new_tokens"] > 0


@pytest.mark.slow
def test_remote_code_does_not_run_unless_asked(tmp_path):
    marker = tmp_path / "ran"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "evil",
                "architectures": ["EvilForCausalLM"],
                "auto_map": {
                    "AutoConfig": "evil.EvilConfig",
                    "AutoModelForCausalLM": "evil.EvilForCausalLM",
                },
            }
        )
    )
    (model / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    with pytest.raises(BadInputError, match="--trust-remote-code"):
        load(str(model), device="cpu")
    assert not marker.exists()
    r = subprocess.run(
        [sys.executable, "-m", "specd.cli", "generate", "x", "--model", str(model)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "--trust-remote-code" in r.stderr
    assert not marker.exists()
