"""The egress rule index (issue 28, "At 100,000 surfaces"): classifying a batch through the index
and its memo gives every flow the surface of the first matching rule, exactly as trying the
rules one by one (``classify_key``) and as the numpy columns; the memo stays bounded under a
spray of destinations; a batch's cost does not follow the number of declared surfaces."""

from __future__ import annotations

import ipaddress
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from alarm.classify.egress import EgressClassifier, EgressMatch
from alarm.collectors.kernel.fastscan import FlowScan
from alarm.collectors.kernel.fence import FlowSubjects

Key = tuple[str, str, int | None, str, int | None, str]

# Pools small enough that rules and flows meet often: nested and overlapping networks of both
# versions, single ports, ranges (overlapping, unaligned, the whole space), interfaces with and
# without '+', and flows outside all of them.
NETWORKS = [
    "0.0.0.0/0", "10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "10.1.2.3", "10.1.2.3/32",
    "10.1.2.128/25", "192.168.0.0/23", "192.168.1.7/31", "::/0", "fd00::/8", "fd00::/64",
    "fd00::5", "fd00::5/127", "2001:db8::/32", "::ffff:0:0/96",
]  # fmt: skip
ADDRESSES = [
    "10.1.2.3", "10.1.2.4", "10.1.2.200", "10.1.3.1", "10.9.9.9", "11.0.0.1", "192.168.1.6",
    "192.168.1.7", "192.168.2.0", "0.0.0.0", "255.255.255.255", "fd00::5", "fd00::4", "fd00::1:0:0:1",
    "fe80::1", "2001:db8::1", "::ffff:10.1.2.3", "::", "not-an-address", "",
]  # fmt: skip
PROTOS = ["tcp", "udp", "icmp", "icmpv6", "esp", "132", "47"]
FLOW_PROTOS = ["TCP", "tcp", "UDP", "ICMP", "ICMPv6", "ESP", "132", "47", "9", ""]
OUTS = ["eth0", "eth+", "veth+", "veth1", "+", "lo", "e+", "veth12"]
FLOW_OUTS = ["eth0", "eth1", "veth12", "veth1", "veth", "", "lo", "e", "wlan0"]
PREFIXES = ["EGRESS_FENCE", "EGRESS_FENCE a", "EGRESS_FENCE b"]
SOURCES = ["a", "b", "c"]


@st.composite
def networks(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        return draw(st.sampled_from(NETWORKS))
    version = draw(st.sampled_from([4, 6]))
    address = draw(st.ip_addresses(v=version))
    return f"{address}/{draw(st.integers(0, 32 if version == 4 else 128))}"


def port_ranges() -> st.SearchStrategy[int | str]:
    port = st.one_of(
        st.sampled_from([0, 1, 53, 80, 443, 1023, 1024, 3128, 65535]), st.integers(0, 65535)
    )
    return st.one_of(
        port,
        st.tuples(port, port).map(lambda p: f"{min(p)}-{max(p)}"),
        st.just("0-65535"),
    )


def some(items: st.SearchStrategy) -> st.SearchStrategy[list]:
    # Empty half the time: a field the rule does not constrain.
    return st.one_of(st.just([]), st.lists(items, min_size=1, max_size=3))


matches = st.builds(
    EgressMatch,
    dst=some(networks()),
    dport=some(port_ranges()),
    proto=some(st.sampled_from(PROTOS)),
    out=some(st.sampled_from(OUTS)),
    uid=some(st.sampled_from([0, 1000, 1001])),
    log_prefix=some(st.sampled_from(PREFIXES)),
    source=some(st.sampled_from(SOURCES)),
)


@st.composite
def addresses(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        return draw(st.sampled_from(ADDRESSES))
    return str(draw(st.ip_addresses()))


flows = st.tuples(
    addresses(),
    st.sampled_from(FLOW_PROTOS),
    st.one_of(
        st.none(),
        st.sampled_from([0, 1, 53, 80, 443, 1024, 3128, 65535, 70000]),
        st.integers(0, 99999),
    ),
    st.sampled_from(FLOW_OUTS),
    st.one_of(st.none(), st.sampled_from([0, 1000, 1001, 7])),
    st.sampled_from(PREFIXES),
)


def subjects(keys: list[Key]) -> FlowSubjects:
    scan = FlowScan()
    scan.add_rows([(0.0, x, o, d, 1, p, dp, u, True) for d, p, dp, o, u, x in keys], 10.0)
    return FlowSubjects(scan)


def indexed(
    rules: list[EgressMatch], memo_limit: int = 1 << 16, miss_rules: int = 0
) -> EgressClassifier:
    # column_rules=0, miss_rules=0: every new flow goes through the index, however few the
    # rules; a large miss_rules: new flows go rule by rule (and into the memo).
    return EgressClassifier(
        [f"s{i}" for i in range(len(rules))],
        rules,
        memo_limit=memo_limit,
        column_rules=0,
        miss_rules=miss_rules,
    )


@settings(max_examples=400, deadline=None)
@given(
    rules=st.lists(matches, max_size=12),
    batches=st.lists(st.lists(flows, max_size=25), min_size=1, max_size=3),
    source=st.sampled_from(SOURCES),
    memo_limit=st.sampled_from([0, 1, 4, 1 << 16]),
    miss_rules=st.sampled_from([0, 10**9]),
)
def test_index_classifies_as_the_rules_one_by_one(rules, batches, source, memo_limit, miss_rules):
    c = indexed(rules, memo_limit, miss_rules)
    for keys in batches * 2:  # twice: the second time from the memo
        s = subjects(keys)
        expected = [c.classify_key(k, source) for k in s.scan.identities()]
        assert c.classify(s, source).tolist() == expected
        assert c.classify_columns(s, source).tolist() == expected
        assert c.memo_size <= max(memo_limit, 0)


def test_first_rule_wins_among_overlapping_rules_the_index_finds_in_different_fields():
    rules = [
        EgressMatch(dport=["400-500"], source=["b"]),  # not for source a
        EgressMatch(dst=["10.0.0.0/8"], dport=[443], proto=["udp"]),
        EgressMatch(out=["veth+"], uid=[1000]),
        EgressMatch(dst=["10.1.0.0/16"], dport=["440-450"]),
        EgressMatch(dst=["10.1.2.3"]),
        EgressMatch(),  # everything else
    ]
    c = indexed(rules)
    keys: list[Key] = [
        ("10.1.2.3", "TCP", 443, "veth7", 1000, "EGRESS_FENCE"),  # rule 2 before 3 and 4
        ("10.1.2.3", "UDP", 443, "veth7", 1000, "EGRESS_FENCE"),  # rule 1
        ("10.1.2.3", "TCP", 443, "eth0", 1000, "EGRESS_FENCE"),  # rule 3
        ("10.1.2.3", "TCP", 22, "eth0", None, "EGRESS_FENCE"),  # rule 4
        ("10.2.0.1", "TCP", 443, "eth0", None, "EGRESS_FENCE"),  # rule 5
    ]
    assert c.classify(subjects(keys), "a").tolist() == [2, 1, 3, 4, 5]
    assert c.classify(subjects(keys), "b").tolist() == [0, 0, 0, 4, 0]


def test_a_spray_of_destinations_keeps_the_memo_bounded_and_counts_what_it_forgets():
    rules = [EgressMatch(dst=[f"10.0.{i >> 8}.{i & 255}/32"]) for i in range(200)]
    c = indexed(rules, memo_limit=1000)
    total = 0
    for b in range(20):
        keys: list[Key] = [
            (f"10.{b}.{i >> 8}.{i & 255}", "TCP", 443, "eth0", None, "EGRESS_FENCE")
            for i in range(500)
        ]
        total += len(keys)
        got = c.classify(subjects(keys), "a").tolist()
        assert got == [(i if b == 0 and i < 200 else -1) for i in range(500)]
        assert c.memo_size <= 1000
    assert c.memo_evictions == total - c.memo_size > 0


def test_a_batch_costs_about_the_same_at_20000_surfaces_as_at_100():
    """Rule by rule, 20,000 surfaces cost some 200x what 100 do; through the index a new flow
    costs a few look-ups either way (a wide margin: the machine is shared)."""

    def per_batch(n: int) -> float:
        rules = [EgressMatch(dst=[f"10.{i >> 16}.{i >> 8 & 255}.{i & 255}/32"]) for i in range(n)]
        c = EgressClassifier([f"s{i}" for i in range(n)], rules)
        best = float("inf")
        for rep in range(5):
            # New flows every time: the index is looked up, not the memo.
            keys: list[Key] = [
                (f"10.0.{i >> 8 & 255}.{i & 255}", "TCP", 443 + rep, "eth0", None, "EGRESS_FENCE")
                for i in range(50)
            ]
            s = subjects(keys)
            t0 = time.perf_counter()
            got = c.classify(s, "a")
            best = min(best, time.perf_counter() - t0)
            assert got.tolist() == list(range(50))
        return best

    small, large = per_batch(100), per_batch(20_000)
    assert large < 10 * small, (small, large)


def test_networks_of_both_versions_never_match_the_other_version():
    c = indexed([EgressMatch(dst=["::/0"]), EgressMatch(dst=["0.0.0.0/0"])])
    keys: list[Key] = [
        ("1.2.3.4", "TCP", 1, "eth0", None, "EGRESS_FENCE"),
        ("::1", "TCP", 1, "eth0", None, "EGRESS_FENCE"),
        ("::ffff:1.2.3.4", "TCP", 1, "eth0", None, "EGRESS_FENCE"),
        ("example.org", "TCP", 1, "eth0", None, "EGRESS_FENCE"),
    ]
    assert c.classify(subjects(keys), "a").tolist() == [1, 0, 0, -1]
    assert ipaddress.ip_address("::ffff:1.2.3.4").version == 6  # as the kernel prints it


@settings(max_examples=300, deadline=None)
@given(
    network=st.one_of(
        networks(),
        st.tuples(st.ip_addresses(v=4), st.ip_addresses(v=4)).map(lambda p: f"{p[0]}/{p[1]}"),
    ),
    address=addresses(),
)
def test_a_destination_network_holds_what_ipaddress_says_it_holds(network, address):
    # Netmask and hostmask forms ("10.0.0.0/255.0.0.0") included, when ipaddress takes them.
    try:
        net = ipaddress.ip_network(network, strict=False)
    except ValueError:
        return
    try:
        inside = ipaddress.ip_address(address) in net
    except ValueError:
        inside = False
    c = indexed([EgressMatch(dst=[network])])
    key: Key = (address, "TCP", 443, "eth0", None, "EGRESS_FENCE")
    assert c.classify_key(key) == (0 if inside else -1)
    assert c.classify(subjects([key]), "a").tolist() == [0 if inside else -1]
