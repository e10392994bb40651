"""examples/intent_action.py: the intent + action decision reaches every tier and every fallback
branch of complete_structured on the faux model, imported and as a script."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from prometheus_client import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "intent_action.py"
ENUM_ERROR = (
    "intent: Input should be 'REFUND', 'ORDER_STATUS', 'SMALL_TALK' or 'UNKNOWN'; "
    "action: Input should be 'ASK_ORDER_ID', 'LOOKUP_ORDER', 'REPLY' or 'TRANSFER_HUMAN'"
)


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("examples_intent_action", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["examples_intent_action"] = mod
    spec.loader.exec_module(mod)
    return mod


def downgrades(src: str, dst: str) -> float:
    labels = {"from_mode": src, "to_mode": dst}
    return REGISTRY.get_sample_value("sessionray_structured_downgrades_total", labels) or 0.0


async def test_every_tier_and_fallback_branch() -> None:
    m = load()
    before = (downgrades("native", "tool"), downgrades("tool", "prompt"))
    s = await m.run_demo()
    good = m.Decision(intent=m.Intent.REFUND, action=m.Action.ASK_ORDER_ID, arguments={"product": "shoes"})

    def story(name: str) -> tuple[object, ...]:
        o = s[name]
        return (o["value"], o["tier"], o["outcome"], o["downgrades"], o["calls"], o["cached_tier"])

    assert story("native") == (good, "native", "first_try", [], 1, "native")
    assert story("native_rejected") == (good, "tool", "first_try", [("native", "tool")], 2, "tool")
    assert story("native_ignored") == (good, "tool", "corrected", [("native", "tool")], 3, "tool")
    assert story("tool_rejected") == (m.SAFE_DECISION, "prompt", "default", [("tool", "prompt")], 3, "prompt")
    errors = {name: (s[name]["error"], s[name]["calls"]) for name in s if "error" in s[name]}
    drift = '{"intent": "refund", "action": "ask for the order id", "arguments": {}}'
    assert errors == {
        "prompt_invalid": ({"reason": ENUM_ERROR, "raw": drift, "tier": "prompt"}, 2),
        "provider_error": (
            {"reason": "provider error: HTTP 503: overloaded", "raw": "", "tier": "native"},
            1,
        ),
        "retry_timeout": ({"reason": "retry failed: timeout after 30.0 s", "raw": "", "tier": "prompt"}, 2),
        "cancelled": ({"reason": "aborted", "raw": "", "tier": "native"}, 1),
    }
    assert s["provider_error"]["cached_tier"] is None  # a 503 is not a capability problem: no downgrade
    assert (downgrades("native", "tool") - before[0], downgrades("tool", "prompt") - before[1]) == (2, 1)


def test_the_script_prints_one_line_per_scenario() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [
        "native", "native_rejected", "native_ignored", "tool_rejected",
        "prompt_invalid", "provider_error", "retry_timeout", "cancelled",
    ]  # fmt: skip
    assert lines[2] == (
        'native_ignored   corrected via native → tool: {"intent":"REFUND","action":"ASK_ORDER_ID",'
        '"arguments":{"product":"shoes"}} (3 calls)'
    )
    assert lines[7] == "cancelled        StructuredOutputError at native: aborted (1 calls)"
    assert "structured output downgrade native -> tool" in proc.stderr  # every fallback is logged
