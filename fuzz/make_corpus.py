"""Write the seed corpora: ``python fuzz/make_corpus.py [name ...]`` (every target without
names). Each harness's ``seeds()`` makes its seeds; crash inputs already kept stay."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from fuzz._harness import write_corpus

TARGETS = ("request_decoders", "zmtp_stream", "record_parse", "reput_scan", "ha_codec",
           "sql92_compile", "grpc_convert")

if __name__ == "__main__":
    for name in sys.argv[1:] or TARGETS:
        seeds = importlib.import_module(f"fuzz.{name}").seeds()
        write_corpus(name, seeds)
        print(f"{name}: {len(seeds)} seeds")
