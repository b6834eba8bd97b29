"""The C extensions, where built: ``load(name)`` is the module or None.

Seven hot loops have a C version beside their Python one: the CommitLog's record writer
(``common.format._record_writer``, see ``common/format/record_writer.py``), the client
protocol's decode and checks of a plain request or answer and its encodes
(``common.format._codec``, see ``decode_request`` in ``common/format/protocol.py``), the plain
ports' ZMTP frame scan and framing (the same module, see ``common/format/zmtp.py``), a send
answer's SendResults (the same module, see ``send_results`` in ``common/client/results.py``), the HA
protocol's DATA and ACK (``common.ha._ha_codec``, see ``decode`` in ``common/ha/protocol.py``),
reput's record
scan and its merge of write digests (``common.store._reput_scan``, see ``common/store/reput.py``
and ``CommitLog.take_digest_run``). ``pip install`` builds them
where gcc and the Python and zlib headers are found (``setup.py``: optional extensions); where
not, or with ``PURE_PYTHON_REPLOG=1`` in the environment, the Python versions run. Each pair
is held to the same results by tests that run both.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

PURE_ENV = "PURE_PYTHON_REPLOG"  # not REPLOG_*: those are config keys


def load(name: str) -> ModuleType | None:
    if os.environ.get(PURE_ENV):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
