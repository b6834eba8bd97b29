"""The batch source over several broker groups' stores: ``load("a=/path/a,b=/path/b")``, the
``stores`` and ``clusterDir`` options, the ``brokerName`` column, one partition per group
segment, and the pushdown of ``brokerName`` filters."""

from __future__ import annotations

from pathlib import Path

import pytest
from reference import expected_rows, normalise
from stores import Store, write_store

from common.core.config import dump_yaml, load_config
from common.pipeline.layout import cluster_replicas, list_segments, parse_stores

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return write_store(tmp_path_factory.mktemp("second") / "store", 700, seed=11)


def rows(df) -> list[dict[str, object]]:
    return sorted((normalise(r.asDict(recursive=True)) for r in df.collect()),
                  key=lambda r: (r["brokerName"], r["commitLogOffset"]))


def expected(stores: dict[str, Store]) -> list[dict[str, object]]:
    out = []
    for name, store in sorted(stores.items()):
        out += [{**r, "brokerName": name} for r in expected_rows(store.root)]
    return out


def test_two_groups_read_as_one_dataframe(spark, store, second) -> None:
    df = spark.read.format("replog").load(f"broker-a={store.path},broker-b={second.path}")
    want = expected({"broker-a": store, "broker-b": second})
    assert df.rdd.getNumPartitions() == len(list_segments(store.root)) + len(
        list_segments(second.root))  # one partition per group segment
    assert rows(df) == want
    counts = {r["brokerName"]: r["count"] for r in df.groupBy("brokerName").count().collect()}
    assert counts == {"broker-a": len(store.written), "broker-b": len(second.written)}
    same = spark.read.format("replog").option(
        "stores", f"broker-a={store.path},broker-b={second.path}").load()
    assert same.count() == len(want)


def test_broker_name_filters_are_pushed_down(spark, store, second) -> None:
    df = (spark.read.format("replog").option("pushFilters", "true")
          .load(f"broker-a={store.path},broker-b={second.path}"))
    only_b = df.where("brokerName = 'broker-b'")
    assert only_b.rdd.getNumPartitions() == len(list_segments(second.root))  # a's not read
    plan = only_b._jdf.queryExecution().executedPlan().toString()
    assert "= broker-b" not in plan
    assert rows(only_b) == expected({"broker-b": second})
    both = df.where(df.brokerName.isin("broker-a", "broker-b"))
    assert both.count() == len(store.written) + len(second.written)


def test_a_cluster_directory_reads_each_groups_most_complete_replica(
        spark, store, second, tmp_path: Path) -> None:
    """What ``replog cluster up`` leaves: one broker.yaml per broker. broker-a has two
    replicas, one behind (a copy of its first segment only): the other is read."""
    behind = tmp_path / "behind"
    (behind / "commitlog").mkdir(parents=True)
    first = list_segments(store.root)[0]
    (behind / "commitlog" / Path(first.path).name).write_bytes(Path(first.path).read_bytes())
    for name, group, path in (("broker-a-0", "broker-a", behind),
                              ("broker-a-1", "broker-a", store.root),
                              ("broker-b-0", "broker-b", second.root)):
        cfg = load_config(None, (), env={}, brokerName=group, storePathRootDir=str(path))
        (tmp_path / name).mkdir()
        (tmp_path / name / "broker.yaml").write_text(dump_yaml(cfg))
    assert cluster_replicas(tmp_path) == {"broker-a": [str(behind), str(store.root)],
                                          "broker-b": [str(second.root)]}
    df = spark.read.format("replog").option("clusterDir", str(tmp_path)).load()
    assert rows(df) == expected({"broker-a": store, "broker-b": second})


def test_a_single_store_names_its_group(spark, store) -> None:
    df = spark.read.format("replog").option("brokerName", "broker-x").load(store.path)
    assert {r.brokerName for r in df.select("brokerName").distinct().collect()} == {"broker-x"}
    plain = spark.read.format("replog").load(store.path).select("brokerName").distinct()
    assert [r.brokerName for r in plain.collect()] == [""]


@pytest.mark.parametrize(("options", "match"), [
    ({"path": "a=/x,b"}, "not broker-group=store-directory"),
    ({"path": "a=/x,a=/y"}, "named twice"),
    ({"stores": "a=/x", "path": "/y"}, "got path, stores"),
    ({}, "replog needs one of"),
    ({"stores": "a=/x", "brokerName": "b"}, "names a single path's group"),
])
def test_bad_store_lists_are_refused(options: dict[str, str], match: str) -> None:
    from common.pipeline.source import ReadOptions

    with pytest.raises(ValueError, match=match):
        ReadOptions.parse(options)


def test_store_lists_parse() -> None:
    assert parse_stores(" a=/x , b=/y/z ") == [("a", "/x"), ("b", "/y/z")]
