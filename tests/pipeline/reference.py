"""An independent expectation: a store's records decoded one by one by the store's own code."""

from __future__ import annotations

from pathlib import Path

from common.core.message import tags_code
from common.format import record
from common.pipeline.layout import list_segments
from common.store.commit_log import to_message


def expected_rows(root: Path) -> list[dict[str, object]]:
    """Every record of a store decoded one at a time by ``commit_log.to_message``."""
    rows = []
    for seg in list_segments(root):
        raw = Path(seg.path).read_bytes()
        pos = 0
        while pos < len(raw):
            checked = record.check(raw, pos, len(raw), expect_phy_offset=seg.base + pos)
            if checked.size <= 0:
                break
            m = to_message(raw, pos)
            rows.append({
                **m.to_json(),  # section 3's fields, as the CLI prints them
                "bodyBytes": m.body,
                "bornHost": m.born_host, "storeHost": m.store_host, "sysFlag": m.sys_flag,
                "bodyCrc": m.body_crc, "storeSize": m.store_size, "flag": m.flag,
                "reconsumeTimes": m.reconsume_times,
                "preparedTransactionOffset": m.prepared_transaction_offset,
                "tagsCode": tags_code(m.tags),
            })
            pos += checked.size
    return rows


def normalise(row: dict[str, object]) -> dict[str, object]:
    """A decoded Arrow row in the shape of ``expected_rows``."""
    out = dict(row)
    out["properties"] = dict(row["properties"])  # type: ignore[call-overload]
    for name in ("bornTimestamp", "storeTimestamp"):
        out[name] = int(row[name].timestamp() * 1000 + 0.5)  # type: ignore[union-attr]
    return out
