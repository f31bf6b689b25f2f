"""Config parsing: defaults, validation errors naming the key, the shipped example."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from peerd.cli.init import render_config
from peerd.control.status import ConfigStatus
from peerd.core.alpha import AlphaPolicy
from peerd.daemon.config import (
    DEFAULT_SOCKET,
    DEFAULT_STATE_DIR,
    Config,
    ConfigError,
    load_config,
    loads_config,
)
from tests.daemon.helpers import ADMIN_HEX, FLEET_HEX

REPO = Path(__file__).resolve().parents[2]
#: A canonical peer id (of the libp2p spec's test key): bootstrap entries are checked to name one.
PEER = "12D3KooWBtg3aaRMjxwedh83aGiUkwSxDwUZkzuJcfaqUmo7R3pq"
FLEET = f'[fleet]\nadmin_public_key = "{ADMIN_HEX}"\nfleet_id = "{FLEET_HEX}"\n'


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "peerd.toml"
    path.write_text(text)
    return path


def doc(**sections: dict[str, Any]) -> dict[str, Any]:
    return {"fleet": {"admin_public_key": ADMIN_HEX, "fleet_id": FLEET_HEX}, **sections}


def test_fleet_only_config_gets_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, FLEET))
    assert cfg.fleet.admin_public_key == bytes.fromhex(ADMIN_HEX)
    assert cfg.fleet.fleet_id == bytes.fromhex(FLEET_HEX)
    assert cfg.fleet.manifest is None
    assert cfg.node.state_dir == DEFAULT_STATE_DIR
    assert cfg.node.socket is None  # derived: the system socket for the system state dir
    assert cfg.node.control_socket == DEFAULT_SOCKET
    assert cfg.learning.staleness == "time"
    assert cfg.learning.capacity == 10
    assert cfg.learning.alpha_policy == AlphaPolicy.parse("uniform")
    assert cfg.task.name == "digits"
    assert cfg.source == (tmp_path / "peerd.toml").resolve()
    assert cfg.status_config() == ConfigStatus(
        tau_max=600.0, staleness="time", capacity=10, rho=0.01, local_steps=10,
        alpha="uniform", epsilon=0.0, max_silence_s=300.0, round_interval_s=10.0,
        task="digits", mode="weights", blend="weighted", local_policy="plain")


def test_values_are_parsed_and_frozen(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, FLEET + """
[node]
socket = "/tmp/a/peerd.sock"
torch_threads = 2
[network]
listen_port = 0
static_peers = ["/ip4/10.0.0.2/tcp/4011/p2p/12D3KooWabc"]
metrics_listen = "127.0.0.1:9464"
[learning]
tau_max = 5
staleness = "time"
capacity = 0
alpha = "staleness:poly:0.5:examples"
[validation]
max_norm = 100.0
[task]
name = "csv"
csv_glob = "/data/*.csv"
csv_features = ["a", "b"]
csv_kind = "regression"
"""))
    assert cfg.node.socket == Path("/tmp/a/peerd.sock")
    assert cfg.node.torch_threads == 2
    assert cfg.network.listen_port == 0
    assert cfg.network.fanout == 3  # the default: a constant cost per sweep
    assert cfg.network.static_peers == ("/ip4/10.0.0.2/tcp/4011/p2p/12D3KooWabc",)
    assert cfg.learning.tau_max == 5.0
    assert isinstance(cfg.learning.tau_max, float)
    assert cfg.learning.alpha_policy.base == "examples"
    assert cfg.validation.limits().max_norm == 100.0
    assert cfg.task.csv_features == ("a", "b")
    assert cfg.task.csv_kind == "regression"
    with pytest.raises(AttributeError):
        cfg.learning.capacity = 3  # type: ignore[misc]


def test_relative_paths_resolve_against_the_config_folder(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, FLEET.replace(
        "[fleet]\n", '[fleet]\nmanifest = "manifest.peerd"\n') + '[node]\nstate_dir = "st"\n'))
    assert cfg.fleet.manifest == tmp_path.resolve() / "manifest.peerd"
    assert cfg.node.state_dir == tmp_path.resolve() / "st"


def test_bootstrap_takes_ip_and_dns_multiaddrs_with_a_peer_id() -> None:
    entries = [f"/ip4/10.0.0.2/tcp/4011/p2p/{PEER}", f"/dns4/host.example/tcp/4011/p2p/{PEER}",
               f"/ip6/2001:db8::2/tcp/4011/p2p/{PEER}"]
    cfg = loads_config(doc(network={"bootstrap": entries}))
    assert cfg.network.bootstrap == tuple(entries)


def test_relays_take_ip_and_dns_multiaddrs_with_a_peer_id() -> None:
    entries = [f"/ip4/203.0.113.7/tcp/4011/p2p/{PEER}", f"/ip6/2001:db8::7/tcp/4011/p2p/{PEER}",
               f"/dns4/relay.example/tcp/4011/p2p/{PEER}", f"/dns6/r6.example/tcp/1/p2p/{PEER}",
               f"/dns/relay.example/tcp/4011/p2p/{PEER}"]
    assert loads_config(doc(network={"relays": entries})).network.relays == tuple(entries)
    assert loads_config(doc()).network.relays == ()


def test_learning_relays_is_on_unless_turned_off() -> None:
    assert loads_config(doc()).network.learn_relays is True
    assert loads_config(doc(network={"learn_relays": False})).network.learn_relays is False


@pytest.mark.parametrize(("sections", "message"), [
    ({"learning": {"capacity": -1}}, "[learning] capacity: must be an integer in [0, 511], got"),
    ({"learning": {"capacity": 2.5}}, "[learning] capacity: must be an integer in [0, 511]"),
    ({"learning": {"capacity": True}}, "[learning] capacity: must be an integer in [0, 511], got"),
    # Unbounded C made the per-peer burst (C + 1 entries) unbounded: issue 13.
    ({"learning": {"capacity": 99999999999}}, "[learning] capacity: must be an integer in"),
    # 0 divided by zero in the byte budget; near 0 made the automatic rate unbounded.
    ({"learning": {"round_interval_s": 0}},
     "[learning] round_interval_s: must be a finite number >= 0.1, got 0"),
    ({"learning": {"round_interval_s": 1e-300}}, "[learning] round_interval_s: must be a"),
    ({"learning": {"capcity": 3}}, "[learning] capcity: unknown key"),
    ({"gossip": {"capacity": 3}}, "[gossip]: unknown section"),
    ({"learning": {"alpha": "median"}}, "[learning] alpha: bad alpha policy"),
    ({"learning": {"staleness": "versions"}}, "[learning] staleness: must be one of time"),
    ({"learning": {"lr": 0}}, "[learning] lr: must be a finite number > 0"),
    ({"learning": {"rho": float("nan")}}, "[learning] rho: must be a finite number"),
    ({"network": {"listen_port": 70000}}, "[network] listen_port: must be an integer in"),
    ({"network": {"listen_host": "lan"}}, "[network] listen_host: must be an IP address"),
    ({"network": {"static_peers": ["10.0.0.2:4011"]}}, "[network] static_peers: list item"),
    ({"network": {"bootstrap": ["/ip4/10.0.0.2/tcp/4011"]}}, "[network] bootstrap: list item"),
    ({"network": {"bootstrap": [f"/ip4/0.0.0.0/tcp/4011/p2p/{PEER}"]}},
     "[network] bootstrap: list item: address is no ip4 unicast address"),
    ({"network": {"bootstrap": [f"/dns4/a_b/tcp/4011/p2p/{PEER}"]}}, "has a bad DNS name"),
    ({"network": {"bootstrap": [f"/ip4/10.0.0.2/tcp/99999/p2p/{PEER}"]}}, "has a bad port"),
    ({"network": {"bootstrap": ["/ip4/10.0.0.2/tcp/4011/p2p/12D3KooWabc"]}},
     "[network] bootstrap: list item: node id"),
    ({"network": {"relays": ["/ip4/10.0.0.2/tcp/4011"]}}, "[network] relays: list item"),
    ({"network": {"relays": [f"/dns4/relay_1/tcp/4011/p2p/{PEER}"]}},
     "[network] relays: list item: relay address has a bad DNS name"),
    ({"network": {"relays": [f"/dnsaddr/relay.example/tcp/4011/p2p/{PEER}"]}},
     "[network] relays: list item: relay address '/dnsaddr"),
    ({"network": {"learn_relays": "yes"}}, "[network] learn_relays: must be"),
    ({"network": {"relays": [f"/ip4/0.0.0.0/tcp/4011/p2p/{PEER}"]}},
     "relay address is no ip4 unicast address"),
    ({"network": {"relays": ["/ip4/10.0.0.2/tcp/4011/p2p/12D3KooWabc"]}},
     "[network] relays: list item: node id is not an Ed25519"),
    ({"network": {"relays": [f"/ip4/10.0.0.{i}/tcp/1/p2p/{PEER}" for i in range(9)]}},
     "[network] relays: must be a list of at most 8 strings"),
    ({"network": {"metrics_listen": "9464"}}, "[network] metrics_listen: must be IP:PORT"),
    ({"network": {"peer_bytes_per_s": 0}}, "[network] peer_bytes_per_s: must be an integer >= 1"),
    ({"network": {"fanout": 0}}, "[network] fanout: must be an integer in [1, 64], got 0"),
    ({"network": {"relay_service": "yes"}}, "[network] relay_service: must be true or false"),
    ({"node": {"lean_memory": "yes"}}, "[node] lean_memory: must be true or false"),
    ({"node": {"socket": "/" + "x" * 120}}, "[node] socket: a Unix socket path holds at most"),
    ({"node": {"log_level": "loud"}}, "[node] log_level: must be one of"),
    ({"task": {"name": "cifar"}}, "[task] name: must be one of digits"),
    ({"task": {"partition": "dirichlet:-1"}}, "[task] partition: dirichlet concentration"),
    ({"task": {"node_index": 3, "node_count": 3}}, "[task] node_index: must be < node_count"),
    ({"task": {"name": "csv"}}, "[task] csv_glob: required"),
    ({"node": "fast"}, "[node] must be a table"),
])
def test_bad_values_name_the_key(sections: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        loads_config(doc(**sections))
    assert message in str(err.value)


@pytest.mark.parametrize(("fleet", "message"), [
    ({"fleet_id": FLEET_HEX}, "[fleet] admin_public_key: required"),
    ({"admin_public_key": ADMIN_HEX[:-2], "fleet_id": FLEET_HEX},
     "[fleet] admin_public_key: must be 32 bytes as 64 hex digits"),
    ({"admin_public_key": "zz" * 32, "fleet_id": FLEET_HEX},
     "[fleet] admin_public_key: must be 32 bytes"),
    ({"admin_public_key": ADMIN_HEX, "fleet_id": FLEET_HEX, "manifest": 3},
     "[fleet] manifest: must be a non-empty path"),
])
def test_fleet_errors(fleet: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        loads_config({"fleet": fleet})
    assert message in str(err.value)


def test_missing_fleet_section() -> None:
    with pytest.raises(ConfigError, match=r"\[fleet\]: required section"):
        loads_config({"node": {}})


def test_rounds_staleness_is_refused_by_the_daemon_with_a_reason(tmp_path: Path) -> None:
    # Issue 12, item 2: nodes share no round counter, so an age in rounds (this node's round
    # minus an origin's version) is meaningless in a daemon; the config used to accept it.
    bad = write(tmp_path, FLEET + '[learning]\nstaleness = "rounds"\n')
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    message = str(err.value)
    assert message.startswith(f"{bad}: [learning] staleness: ")
    assert "no round counter" in message
    assert 'use "time"' in message
    assert "\n" not in message
    # `peerd run` stops at start-up: exit 2 and that one line, no traceback.
    from typer.testing import CliRunner

    from peerd.cli.app import app

    result = CliRunner().invoke(app, ["run", "--config", str(bad)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"peerd: {message}"


def test_max_silence_defaults_to_half_tau_max_and_must_stay_below_it() -> None:
    # Issue 12, item 3: a quiet node (epsilon > 0) republishes after max_silence_s.
    assert loads_config(doc()).learning.max_silence_s is None
    assert loads_config(doc()).learning.silence_limit_s == 300.0
    assert loads_config(doc(learning={"tau_max": 60})).learning.silence_limit_s == 30.0
    set_ = loads_config(doc(learning={"tau_max": 60, "max_silence_s": 45})).learning
    assert set_.silence_limit_s == 45.0
    with pytest.raises(ConfigError, match=r"\[learning\] max_silence_s: must be < tau_max "
                                          r"\(600\), got 600"):
        loads_config(doc(learning={"max_silence_s": 600}))
    with pytest.raises(ConfigError, match=r"\[learning\] max_silence_s: must be a finite "
                                          r"number > 0"):
        loads_config(doc(learning={"max_silence_s": 0}))


def test_custom_task_spelling_accepted() -> None:
    assert loads_config(doc(task={"name": "mypkg.tasks:make_task"})).task.name == \
        "mypkg.tasks:make_task"


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[fleet\n"))
    bad = write(tmp_path, FLEET + "[learning]\ncapacity = -1\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert str(err.value).startswith(f"{bad}: [learning] capacity")


def test_default_constructor_matches_a_fleet_only_file(tmp_path: Path) -> None:
    built = Config.default(bytes.fromhex(ADMIN_HEX), bytes.fromhex(FLEET_HEX),
                           state_dir=tmp_path / "s", socket=tmp_path / "c.sock")
    assert built.node.state_dir == tmp_path / "s"
    assert built.node.socket == tmp_path / "c.sock"
    loaded = load_config(write(tmp_path, FLEET))
    assert built.learning == loaded.learning
    assert built.task == loaded.task


def test_example_config_is_accepted_and_generated() -> None:
    example = REPO / "systemd" / "peerd.toml.example"
    cfg = load_config(example)
    assert cfg.fleet.manifest == example.resolve().parent / "manifest.peerd"
    # The example is the init template with placeholder values: they cannot drift apart.
    rendered = render_config(admin_public_key="00" * 32, fleet_id="00" * 16,
                             manifest="manifest.peerd")
    assert example.read_text().endswith(rendered)


def test_every_commented_default_is_the_real_default() -> None:
    # Uncomment every "# key = value" line of the template: the result must load and equal
    # the defaults, so the comments never lie about what a missing key means.
    text = render_config(admin_public_key=ADMIN_HEX, fleet_id=FLEET_HEX, manifest=None)
    lines = []
    for line in text.splitlines():
        body = line[2:] if line.startswith("# ") and " = " in line.split("#")[1] else line
        key = body.split("=")[0].strip()
        if key in ("manifest", "socket", "socket_group", "metrics_listen", "csv_glob",
                   "peer_bytes_per_s", "max_silence_s", "model", "group",
                   "capacity_per_group", "temperature"):
            continue  # examples of optional settings, not defaults (temperature: the form's)
        lines.append(body.split("  #")[0])
    data = tomllib.loads("\n".join(lines))
    assert sum(len(v) for v in data.values()) >= 30  # the uncommenting really happened
    cfg = loads_config(data)
    base = Config.default(bytes.fromhex(ADMIN_HEX), bytes.fromhex(FLEET_HEX))
    assert (cfg.node, cfg.network, cfg.learning, cfg.validation, cfg.task) == (
        base.node, base.network, base.learning, base.validation, base.task)


def test_peer_byte_budget_fits_one_full_session_and_scales_with_the_round() -> None:
    import torch

    from peerd.core.entry import Schema
    from peerd.daemon.startup import SESSION_CONTROL_BYTES, peer_byte_budget
    from peerd.node.wirearrays import wire_schema
    from peerd.protocol.admission import entry_frame_limit

    schema = Schema.of({"w": torch.zeros(1000, 10)})
    frame = entry_frame_limit(wire_schema(schema))
    assert frame >= 40_000  # 10k float32 parameters, plus the head
    cfg = loads_config(doc(learning={"capacity": 3, "round_interval_s": 5.0}))
    rate, burst = peer_byte_budget(cfg, schema)
    assert burst == 4 * frame + SESSION_CONTROL_BYTES  # C + 1 entries at the largest size
    assert rate == pytest.approx(2 * burst / 5.0)
    fixed = loads_config(doc(network={"peer_bytes_per_s": 12345}))
    assert peer_byte_budget(fixed, schema)[0] == 12345.0


def test_loading_a_config_and_its_limits_imports_no_torch(tmp_path: Path) -> None:
    # `peerd status` and `peerd init` load the config; torch costs them seconds of start-up.
    import subprocess
    import sys

    path = write(tmp_path, FLEET + "[validation]\nmax_norm = 5.0\n")
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from peerd.daemon.config import load_config\n"
        f"limits = load_config(Path({str(path)!r})).validation.limits()\n"
        "assert limits.max_norm == 5.0, limits\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "False"


def test_the_socket_follows_the_state_dir_unless_set(tmp_path: Path) -> None:
    # Two daemons that differ only in their state directory never share a control socket.
    a = loads_config(doc(node={"state_dir": str(tmp_path / "a")}))
    b = loads_config(doc(node={"state_dir": str(tmp_path / "b")}))
    assert a.node.control_socket == tmp_path / "a" / "peerd.sock"
    assert b.node.control_socket == tmp_path / "b" / "peerd.sock"
    system = loads_config(doc(node={"state_dir": "/var/lib/peerd"}))
    assert system.node.control_socket == DEFAULT_SOCKET
    chosen = loads_config(doc(node={"state_dir": str(tmp_path / "a"),
                                    "socket": str(tmp_path / "s.sock")}))
    assert chosen.node.control_socket == tmp_path / "s.sock"


def test_the_largest_capacity_and_shortest_round_keep_the_byte_budget_finite() -> None:
    import math

    import torch

    from peerd.core.entry import Schema
    from peerd.daemon.config_limits import MAX_CAPACITY, MIN_ROUND_INTERVAL_S
    from peerd.daemon.startup import peer_byte_budget

    cfg = loads_config(doc(learning={"capacity": MAX_CAPACITY,
                                     "round_interval_s": MIN_ROUND_INTERVAL_S}))
    schema = Schema.of({"w": torch.zeros(1000)})
    rate, burst = peer_byte_budget(cfg, schema)
    assert math.isfinite(rate)
    assert rate > 0
    assert burst < 2**40  # far from "unlimited"


OLD_FLAT = """[learning]
mode = "knowledge"
key_dim = 32
distill_beta = 0.5
distill_temperature = 2.0
distill_r = 8
sample_capacity = 5000
cordial_images_per_digit = 10
cordial_coordination = false
cordial_warmup_epochs = 5
cordial_bucket_s = 2.5
cordial_window = 16
fedbss_warmup_rounds = 3
fedbss_epochs = 4
fedbss_regrow = 0.5
fedbss_steps = 7
"""
NESTED = """[learning]
mode = "knowledge"
sample_capacity = 5000
[learning.knowledge]
key_dim = 32
beta = 0.5
temperature = 2.0
neighbours = 8
[learning.cordial]
images_per_digit = 10
coordination = false
warmup_epochs = 5
bucket_s = 2.5
window = 16
[learning.fedbss]
warmup_rounds = 3
epochs = 4
regrow = 0.5
steps = 7
"""


def test_an_old_flat_config_and_a_nested_one_load_the_same_settings(tmp_path: Path) -> None:
    old = load_config(write(tmp_path, FLEET + OLD_FLAT))
    new = load_config(write(tmp_path, FLEET + NESTED))
    assert new.deprecations == ()
    assert old.learning == new.learning
    assert (old.learning.knowledge.neighbours, old.learning.cordial.window,
            old.learning.fedbss.steps) == (8, 16, 7)
    # One line per flat key read, naming its new place.
    assert len(old.deprecations) == 13
    assert "[learning] fedbss_regrow is deprecated: use [learning.fedbss] regrow" in \
        old.deprecations
    assert all("\n" not in line and "deprecated: use [learning." in line
               for line in old.deprecations)


def test_the_written_config_uses_the_nested_tables() -> None:
    text = render_config(admin_public_key=ADMIN_HEX, fleet_id=FLEET_HEX, manifest=None)
    for table in ("[learning.knowledge]", "[learning.cordial]", "[learning.fedbss]"):
        assert f"\n{table}" in text
    for old in ("distill_", "cordial_", "fedbss_"):
        assert f"# {old}" not in text
    assert loads_config(tomllib.loads(text)).deprecations == ()
