"""The default model as llama.cpp's quantizer writes it for another file type (Q4_K_M by
default), for measuring specd on K-quant files: llama-cpp-python's ``llama_model_quantize``
(``pip install 'specd[llamacpp]'``) run on the shipped Q4_1 file, which it de-quantizes and
quantizes again (no finer copy of the weights is on the machine, so the file's quality is
below that of one made from the original weights; its types and speed are a real file's).

    python scripts/k_quant_file.py /tmp/SmolLM2-135M-Instruct.Q4_K_M.gguf --type Q4_K_M
    specd bench --workload editor --model /tmp/SmolLM2-135M-Instruct.Q4_K_M.gguf ...

Prints the file's tensor types and counts.
"""

from __future__ import annotations

import argparse
import ctypes
from collections import Counter
from pathlib import Path

from specd.forward.models import DEFAULT_MODEL, gguf_file


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument(
        "--type", default="Q4_K_M", help="a llama.cpp file type: Q4_K_M, Q5_K_M, Q6_K, ..."
    )
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    import llama_cpp
    from gguf import GGUFReader

    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{args.type.upper()}", None)
    if ftype is None:
        raise SystemExit(f"llama.cpp has no file type {args.type!r}")
    source = gguf_file(DEFAULT_MODEL)
    params = llama_cpp.llama_model_quantize_default_params()
    params.allow_requantize = True
    params.ftype = ftype
    params.nthread = args.threads
    rc = llama_cpp.llama_model_quantize(
        str(source).encode(), str(args.out).encode(), ctypes.byref(params)
    )
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed ({rc})")
    types = Counter(t.tensor_type.name for t in GGUFReader(args.out).tensors)
    print(f"{args.out}: " + ", ".join(f"{n} {k}" for k, n in types.most_common()))


if __name__ == "__main__":
    main()
