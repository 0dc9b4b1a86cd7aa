from hypothesis import given, settings
from hypothesis import strategies as st

from alarm.classify import EgressClassifier
from alarm.config import config_from_dict
from alarm.fastscan import FlowScan


def classifier():
    config = config_from_dict(
        {
            "surfaces": [
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
            ]
        }
    )
    return EgressClassifier(config.surfaces, cache_size=4)


def test_first_matching_rule_wins_and_rest_is_unclassified():
    c = classifier()
    assert c.classify(("10.20.3.4", "TCP", 443, "eth0", None, "EGRESS_FENCE")) == "proxy"
    assert c.classify(("10.20.3.4", "TCP", 3129, "eth0", None, "EGRESS_FENCE")) == "proxy"
    assert c.classify(("fd00::1", "TCP", 443, "eth0", None, "EGRESS_FENCE")) == "proxy"
    assert c.classify(("10.20.3.4", "UDP", 443, "eth0", None, "EGRESS_FENCE")) == "unclassified"
    assert c.classify(("8.8.8.8", "UDP", 53, "eth0", None, "EGRESS_FENCE")) == "dns"
    assert c.classify(("1.1.1.1", "TCP", 80, "veth12", 1001, "EGRESS_FENCE")) == "ci-user"
    assert c.classify(("1.1.1.1", "TCP", 80, "eth0", 1001, "EGRESS_FENCE")) == "unclassified"
    assert c.classify(("1.1.1.1", "ICMP", None, "eth0", None, "EGRESS_FENCE board")) == "tagged"
    assert c.classify(("not-an-ip", "TCP", 443, "eth0", None, "EGRESS_FENCE")) == "unclassified"


def test_cache_is_bounded_under_destination_churn():
    c = classifier()
    for i in range(1000):
        assert (
            c.classify((f"10.20.{i // 256}.{i % 256}", "TCP", 443, "eth0", None, "EGRESS_FENCE"))
            == "proxy"
        )
    assert len(c._cache) <= 4
    assert c.cache_clears > 0


_idents = st.tuples(
    st.sampled_from(["10.20.1.1", "10.21.0.1", "fd00::5", "fe80::1", "1.1.1.1"]),
    st.sampled_from(["TCP", "tcp", "UDP", "ICMP", ""]),
    st.one_of(st.none(), st.sampled_from([0, 53, 443, 3128, 3130, 3131, 65535])),
    st.sampled_from(["eth0", "veth9a", "veth", "", "lo"]),
    st.one_of(st.none(), st.sampled_from([0, 1000, 1001])),
    st.sampled_from(["EGRESS_FENCE", "EGRESS_FENCE board", "EGRESS_FENCE:"]),
)


@settings(max_examples=200, deadline=None)
@given(idents=st.lists(_idents, max_size=30))
def test_columns_classify_as_one_at_a_time(idents):
    # The backtest classifies whole chunks through classify_columns; the service one flow at
    # a time through classify.  They must agree on every identity.
    scan = FlowScan()
    scan.add_rows([(0.0, p, o, d, 1, pr, dp, u, False) for d, pr, dp, o, u, p in idents], 1.0)
    names, surface_of = classifier().classify_columns(scan)
    one = classifier()
    assert [names[i] for i in surface_of.tolist()] == [one.classify(k) for k in scan.identities()]
