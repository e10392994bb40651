"""examples/contracts.py (IntentResult / ActionDecision) runs and produces the documented
outcomes, both imported and as a script."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("examples_contracts", ROOT / "examples" / "contracts.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["examples_contracts"] = mod
    spec.loader.exec_module(mod)
    return mod


async def test_contracts_demo_outcomes(deltas) -> None:
    m = load()
    out = await m.run_demo()
    assert out["intent"] == m.IntentResult(
        intent=m.Intent.REFUND_REQUEST, confidence=0.9, slots={"product": "鞋"}, need_human=False
    )
    value, outcome, reason = out["action"]
    assert value == m.ActionDecision(
        action=m.Action.ASK_CLARIFY, arguments={"missing": "order_id"}, reason="no order number"
    )
    assert outcome == "corrected"
    assert reason == (
        "action: Input should be 'QUERY_ORDER', 'CREATE_TICKET', 'TRANSFER_HUMAN', "
        "'ASK_CLARIFY' or 'RENDER_CARD'"
    )
    assert out["fallback"] == m.SAFE_INTENT
    assert out["error"] == (
        "(root): Invalid JSON: expected value at line 1 column 1",
        "```json\n{}\n```",
        "prompt",
    )
    assert out["calls"] == 7
    assert deltas.structured() == {
        ("native", "first_try"): 1,
        ("tool", "corrected"): 1,
        ("prompt", "default"): 1,
        ("prompt", "failed"): 1,
    }


def test_contracts_schema_is_generated_with_enums() -> None:
    m = load()
    from runtime.reply.json_schema import strict_json_schema

    schema = strict_json_schema(m.ActionDecision)
    assert schema["required"] == ["action", "arguments", "reason"]
    assert schema["$defs"]["Action"]["enum"] == [
        "QUERY_ORDER", "CREATE_TICKET", "TRANSFER_HUMAN", "ASK_CLARIFY", "RENDER_CARD"
    ]  # fmt: skip


def test_contracts_script_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "contracts.py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert (
        lines[0] == '1 first try : {"intent":"REFUND_REQUEST","confidence":0.9,'
        '"slots":{"product":"鞋"},"need_human":false}'
    )
    assert lines[2] == '3 default   : {"intent":"UNKNOWN","confidence":0.0,"slots":{},"need_human":true}'
    assert lines[4] == "LLM calls   : 7"
