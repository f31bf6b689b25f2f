"""A node the admin has not admitted (issue 13): real daemons on loopback (mDNS off). The
refused node's status says `not_member`, never `malformed`, and tells the operator what to
do, in `peerd status` and in its log, whether it holds the manifest or learns it from a
peer's refusal."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.mesh import (
    PEERD,
    Node,
    make_fleet,
    start,
    status,
    wait_for,
    write_overrides,
)


@pytest.mark.parametrize("manifest", ["configured", "none"])
def test_a_node_not_admitted_is_told_to_ask_for_admission(
    tmp_path: Path, running: list[Node], manifest: str
) -> None:
    member, outsider = make_fleet(tmp_path, 2, admit=1, base_port=27240 if manifest ==
                                  "configured" else 27250)
    if manifest == "none":  # the placeholder: it can learn that it is refused only from peers
        write_overrides(outsider.config, fleet={"manifest": ""})
    start((member, outsider), running)

    def refused() -> bool:
        s = outsider.status()
        return s is not None and s["node"]["membership"] == "not_member" and (
            manifest == "configured" or s["rejected"].get("not_member", 0) > 0)

    wait_for(refused, 120, "the outsider to learn it is not admitted", [member, outsider])
    shown = status(outsider)
    assert "malformed" not in shown["rejected"]  # before: "malformed: peer refused: …"
    fleet = shown["node"]["fleet"]
    advice = (f"not admitted to fleet {fleet}: ask the admin to run "
              f"'peerd fleet admit {outsider.id}'")
    assert advice in outsider.logs()
    human = subprocess.run([*PEERD, "status", "--state-dir", str(outsider.dir)],
                           capture_output=True, text=True, timeout=120, check=False,
                           env={**os.environ, "COLUMNS": "400"})  # no wrapped lines
    assert human.returncode == 0, human.stderr
    assert f"not_member: {advice}" in human.stdout
    assert status(member)["node"]["membership"] == "member"
