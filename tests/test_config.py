import subprocess
import sys

import pytest

from alarm.config import (
    ConfigError,
    config_from_dict,
    config_warnings,
    load_config,
    parse_duration,
)


def test_embedded_default_is_valid_and_watches_the_kernel_log():
    config = load_config(None)
    assert config.surfaces == []
    assert config.sources[0].type == "auto"
    assert config.sources[0].prefixes == ["EGRESS_FENCE"]
    assert config.http.host_port()[0] == "127.0.0.1"


@pytest.mark.parametrize(
    ("text", "seconds"), [("10s", 10), ("5m", 300), ("1.5h", 5400), (30, 30), ("250ms", 0.25)]
)
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


def test_every_problem_is_named_by_its_key_path():
    with pytest.raises(ConfigError) as err:
        config_from_dict(
            {
                "tick": "soon",
                "surfaces": [
                    {"name": "ok", "match": {"dst": ["10.0.0.0/33"], "dport": ["9-1", 70000]}},
                    {"name": "unclassified"},
                    {"name": "ok"},
                ],
                "sources": [{"name": "f", "type": "file"}],
                "webhooks": [{"url": "ftp://x"}],
                "typo_key": 1,
            }
        )
    text = "\n".join(err.value.problems)
    for expected in (
        "tick:",
        "surfaces[0].match.dst:",
        "surfaces[0].match.dport:",
        "surfaces[1].name:",
        "sources[0].paths:",
        "webhooks[0].url:",
        "typo_key:",
        # a whole-config check, in the same pass as the field errors (pydantic alone runs it
        # only once every field is valid, so it showed up after the first batch was fixed)
        "surfaces: name 'ok' is declared twice",
    ):
        assert expected in text, (expected, text)


def test_duplicate_surface_names_are_rejected():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"surfaces": [{"name": "a"}, {"name": "a"}]})
    assert "declared twice" in str(err.value)


def test_check_config_exit_codes(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(
        "tick: 5s\nsurfaces:\n  - {name: proxy, match: {dst: [10.0.0.0/8], dport: [443]}}\n"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("tick: 5s\nsurfaces:\n  - {name: proxy, match: {dport: [99999]}}\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("tick: [unclosed\n")
    run = [sys.executable, "-m", "alarm.cli", "check-config"]
    assert subprocess.run([*run, str(good)], capture_output=True).returncode == 0
    # The flag `run` and `backtest` take works here too.
    assert subprocess.run([*run, "--config", str(good)], capture_output=True).returncode == 0
    res = subprocess.run([*run], capture_output=True, text=True)
    assert res.returncode == 2 and "give one config file" in res.stderr
    res = subprocess.run([*run, str(bad)], capture_output=True, text=True)
    assert res.returncode == 2
    assert "surfaces[0].match.dport" in res.stderr
    res = subprocess.run([*run, str(broken)], capture_output=True, text=True)
    assert res.returncode == 2 and "YAML" in res.stderr
    res = subprocess.run([*run, str(tmp_path / "missing.yaml")], capture_output=True, text=True)
    assert res.returncode == 2 and "cannot read" in res.stderr


def test_run_with_an_unreadable_secret_exits_2_naming_it(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path / 'state'}\n"
        f"sources: [{{name: k, type: file, paths: [{tmp_path / 'kern.log'}]}}]\n"
        "notifications:\n  destinations:\n"
        "    - {type: webhook, name: soc, url: 'http://127.0.0.1:1/hook', secrets: [{env: CAPALARM_TEST_UNSET}]}\n"
    )
    res = subprocess.run(
        [sys.executable, "-m", "alarm.cli", "run", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2
    assert "notifications.destinations[0]" in res.stderr and "CAPALARM_TEST_UNSET" in res.stderr
    assert "Traceback" not in res.stderr


def test_whole_config_problems_come_with_the_field_errors_in_one_pass():
    with pytest.raises(ConfigError) as err:
        config_from_dict(
            {
                "sources": [{"name": "k", "type": "kmsg"}, {"name": "k", "type": "kmsg"}],
                "surfaces": [
                    {"name": "a", "spike": {"z": -1}},
                    {"name": "a", "match": {"source": ["nope"]}},
                    {"name": "b", "kind": "fs", "match": {"source": ["k"]}},
                    {"name": "b"},
                ],
                "egress_canary": {"sources": ["ghost"]},
            }
        )
    assert set(err.value.problems) >= {
        "surfaces[0].spike.z: Input should be greater than 0",
        "surfaces: name 'a' is declared twice",
        "surfaces: name 'b' is declared twice",
        "sources: name 'k' is declared twice",
        "surfaces[1].match.source: no source named 'nope' is declared",
        "surfaces[2].match.source: source 'k' feeds egress surfaces, not fs",
        "egress_canary.sources: 'ghost' is not a declared kernel source",
    }, err.value.problems
    assert len(err.value.problems) == len(set(err.value.problems))  # each said once


def test_whole_config_problems_alone_are_all_named_too():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"surfaces": [{"name": "a"}, {"name": "a"}, {"name": "b"}, {"name": "b"}]})
    assert err.value.problems == [
        "surfaces: name 'a' is declared twice",
        "surfaces: name 'b' is declared twice",
    ]


@pytest.mark.parametrize(
    ("proto", "message"),
    [
        ("udpp", "unknown protocol 'udpp': the kernel logs tcp, udp, udplite, icmp, icmpv6"),
        ("sctp", "'sctp': the kernel logs it as PROTO=132: write 132"),
        ("ipv6-icmp", "PROTO=ICMPv6: write icmpv6"),
        (6, "the kernel logs protocol 6 as PROTO=TCP: write tcp"),
        ("17", "the kernel logs protocol 17 as PROTO=UDP: write udp"),
        (256, "protocol 256 is not an IP protocol number (0-255)"),
        (True, "True is not a protocol"),
        ("", "unknown protocol ''"),
    ],
)
def test_a_protocol_the_kernel_never_logs_is_rejected_naming_the_item(proto, message):
    """The classifier compares ``match.proto`` with the PROTO= the kernel printed: a name it
    never prints made the surface match nothing, silently."""
    with pytest.raises(ConfigError) as err:
        config_from_dict({"surfaces": [{"name": "s", "match": {"proto": ["tcp", proto]}}]})
    [problem] = err.value.problems
    assert problem.startswith("surfaces[0].match.proto[1]: ") and message in problem, problem


def test_protocols_the_kernel_logs_are_accepted_as_it_prints_them():
    config = config_from_dict(
        {
            "surfaces": [
                {"name": "s", "match": {"proto": ["TCP", "udp", "ICMPv6", "esp", 132, "47"]}}
            ]
        }
    )
    assert config.surfaces[0].match.proto == ["tcp", "udp", "icmpv6", "esp", "132", "47"]


def test_a_config_that_watches_nothing_is_valid_with_a_warning():
    assert config_warnings(load_config(None)) == []
    assert config_warnings(config_from_dict({"sources": []})) == [
        "sources: none declared, so this config watches nothing (no writes are counted)"
    ]
    fs_unfed = config_from_dict({"surfaces": [{"name": "cache", "kind": "fs"}]})
    assert config_warnings(fs_unfed) == [
        "surfaces[0] ('cache'): no source feeds fs surfaces, so it watches nothing "
        "(declare a source of type fs)"
    ]


@pytest.mark.parametrize(
    "body", ["tick: [unclosed\n", "tick: 10s\ntick: 1h\n", "surfaces: " + "[" * 20_000]
)
def test_yaml_errors_name_the_file_not_a_unicode_string(tmp_path, body):
    path = tmp_path / "capalarm.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    [problem] = err.value.problems
    assert "<unicode string>" not in problem
    assert problem.startswith(f"(yaml): {path} is not valid YAML: ")
    if "nested" not in problem:
        assert f'in "{path}", line ' in problem


@pytest.mark.parametrize(
    "declared",
    [
        [],
        [{"name": "k", "type": "file", "paths": ["/x"]}],
        [{"name": "r", "type": "registry", "api": "pypi", "url": "http://x/"}],
    ],
)
def test_an_unknown_source_type_is_told_every_registered_type_whatever_else_is_declared(
    declared: list[dict[str, object]],
) -> None:
    # The union of a config's sources holds the settings of the types it declares only
    # (issue 29); its tags, and so its messages, are every registered type's.
    with pytest.raises(ConfigError) as exc:
        config_from_dict(
            {"sources": [*declared, {"name": "b", "type": "nope"}, {"name": "c", "type": "fs"}]}
        )
    n = len(declared)
    assert exc.value.problems == [
        f"sources[{n}].type: unknown type 'nope' (known: 'auto', 'kmsg', 'journald', 'file', 'fs', 'registry')",
        f"sources[{n + 1}].paths: Field required",
    ]
