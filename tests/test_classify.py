"""Classification per kind: the first matching rule wins, the rest is unclassified; a flow's
columns classify as the reference one-flow rule; fs trees and globs; registry repositories; the
``source`` selector for every kind."""

from hypothesis import given, settings
from hypothesis import strategies as st

from alarm.classify.egress import EgressClassifier
from alarm.classify.fs import FsClassifier
from alarm.classify.registry import RegistryClassifier
from alarm.collectors.kernel.fastscan import FlowScan
from alarm.collectors.kernel.fence import FlowSubjects
from alarm.config import config_from_dict
from alarm.events import KeyedSubjects

SURFACES = [
    {
        "name": "proxy",
        "match": {
            "dst": ["10.20.0.0/16", "fd00::/8"],
            "dport": [443, "3128-3130"],
            "proto": ["tcp"],
        },
    },
    {"name": "dns", "match": {"dport": [53], "proto": ["udp"]}},
    {"name": "ci-user", "match": {"uid": [1001], "out": ["veth+"]}},
    {"name": "tagged", "match": {"log_prefix": ["EGRESS_FENCE board"]}},
    {"name": "from-b", "match": {"source": ["b"], "dport": [80]}},
]


def classifier() -> EgressClassifier:
    config = config_from_dict(
        {"sources": [{"name": "a"}, {"name": "b", "type": "journald"}], "surfaces": SURFACES}
    )
    egress = [s for s in config.surfaces if s.kind == "egress"]
    return EgressClassifier([s.name for s in egress], [s.match for s in egress])


def name_of(c: EgressClassifier, key, source: str = "a") -> str:
    i = c.classify_key(key, source)
    return "unclassified" if i < 0 else c.surfaces[i]


def test_first_matching_rule_wins_and_rest_is_unclassified():
    c = classifier()
    assert name_of(c, ("10.20.3.4", "TCP", 443, "eth0", None, "EGRESS_FENCE")) == "proxy"
    assert name_of(c, ("10.20.3.4", "TCP", 3129, "eth0", None, "EGRESS_FENCE")) == "proxy"
    assert name_of(c, ("fd00::1", "TCP", 443, "eth0", None, "EGRESS_FENCE")) == "proxy"
    assert name_of(c, ("10.20.3.4", "UDP", 443, "eth0", None, "EGRESS_FENCE")) == "unclassified"
    assert name_of(c, ("8.8.8.8", "UDP", 53, "eth0", None, "EGRESS_FENCE")) == "dns"
    assert name_of(c, ("1.1.1.1", "TCP", 80, "veth12", 1001, "EGRESS_FENCE")) == "ci-user"
    assert name_of(c, ("1.1.1.1", "TCP", 80, "eth0", 1001, "EGRESS_FENCE")) == "unclassified"
    assert name_of(c, ("1.1.1.1", "ICMP", None, "eth0", None, "EGRESS_FENCE board")) == "tagged"
    assert name_of(c, ("not-an-ip", "TCP", 443, "eth0", None, "EGRESS_FENCE")) == "unclassified"


def test_source_selector_takes_only_that_sources_records():
    c = classifier()
    key = ("1.1.1.1", "TCP", 80, "eth0", None, "EGRESS_FENCE")
    assert name_of(c, key, "b") == "from-b"
    assert name_of(c, key, "a") == "unclassified"


_idents = st.tuples(
    st.sampled_from(["10.20.1.1", "10.21.0.1", "fd00::5", "fe80::1", "1.1.1.1"]),
    st.sampled_from(["TCP", "tcp", "UDP", "ICMP", ""]),
    st.one_of(st.none(), st.sampled_from([0, 53, 80, 443, 3128, 3130, 3131, 65535])),
    st.sampled_from(["eth0", "veth9a", "veth", "", "lo"]),
    st.one_of(st.none(), st.sampled_from([0, 1000, 1001])),
    st.sampled_from(["EGRESS_FENCE", "EGRESS_FENCE board", "EGRESS_FENCE:"]),
)


@settings(max_examples=200, deadline=None)
@given(idents=st.lists(_idents, max_size=30), source=st.sampled_from(["a", "b"]))
def test_columns_classify_as_one_at_a_time(idents, source):
    # Batches are classified in columns; the one-flow rule is the reference: they must agree
    # on every identity.
    scan = FlowScan()
    scan.add_rows([(0.0, p, o, d, 1, pr, dp, u, False) for d, pr, dp, o, u, p in idents], 1.0)
    c = classifier()
    got = c.classify(FlowSubjects(scan), source).tolist()
    assert got == [c.classify_key(k, source) for k in scan.identities()]


def fs_classifier() -> FsClassifier:
    config = config_from_dict(
        {
            "surfaces": [
                {"name": "scratch", "kind": "fs", "match": {"path": ["/srv/scratch"]}},
                {"name": "pip-cache", "kind": "fs", "match": {"path": ["/var/cache/pip/**/*.whl"]}},
                {"name": "any-cache", "kind": "fs", "match": {"path": ["/var/cache/*/"]}},
            ],
        }
    )
    fs = [s for s in config.surfaces if s.kind == "fs"]
    return FsClassifier([s.name for s in fs], [s.match for s in fs])


def test_fs_trees_and_globs():
    c = fs_classifier()
    paths = [
        "/srv/scratch",
        "/srv/scratch/a/b.bin",
        "/srv/scratchy/x",
        "/var/cache/pip/wheels/ab/cd/x-1.0-py3-none-any.whl",
        "/var/cache/pip/x.whl",
        "/var/cache/pip/http/x.body",
        "/var/cache/npm/_cacache/index",
        "/tmp/elsewhere",
    ]
    got = c.classify(KeyedSubjects(paths, paths), "watch").tolist()
    names = ["unclassified" if i < 0 else c.surfaces[i] for i in got]
    assert names == [
        "scratch",
        "scratch",
        "unclassified",
        "pip-cache",
        "pip-cache",
        "any-cache",
        "any-cache",
        "unclassified",
    ]


def test_registry_repositories_and_sources():
    config = config_from_dict(
        {
            "surfaces": [
                {
                    "name": "sandbox-npm",
                    "kind": "registry",
                    "match": {"repository": ["@sandbox/*"]},
                },
                {"name": "rest", "kind": "registry", "match": {"repository": ["internal-*"]}},
            ]
        }
    )
    reg = [s for s in config.surfaces if s.kind == "registry"]
    c = RegistryClassifier([s.name for s in reg], [s.match for s in reg])
    keys = [("@sandbox/tool", "1.0.0"), ("@other/tool", "1"), ("internal-lib", "2"), ("x", "")]
    assert c.classify(KeyedSubjects(keys, ["c"] * 4), "npm").tolist() == [0, -1, 1, -1]
