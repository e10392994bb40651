# ruff: noqa: E501  (one-line-per-case tables read better unwrapped)
"""``*.tool.md`` loading: the shipped example over real loopback HTTP, Python entry points, and
start-up hard fails (docs/decisions.md#tool-md-hard-fail)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.agent.tools import AgentToolResult, ToolValidationError, validate_tool_call
from runtime.config.tool_permissions import ToolPermissions
from runtime.llm.types import TextContent, ToolCall
from runtime.session.tool_md import ToolMdError, load_tool_dir, load_tool_md
from runtime.session.tool_policy import get_permissions
from tests.session.http_stub import JsonStub

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tools"


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


async def run(tool, args: dict) -> AgentToolResult | str:  # type: ignore[no-untyped-def]
    params = validate_tool_call([tool], ToolCall(id="c1", name=tool.name, arguments=args))
    return await tool.execute("c1", params, None, lambda _r: None)


async def test_shipped_example_calls_its_http_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    with JsonStub(200, {"city": "Berlin", "temperature": 3, "conditions": "fog"}) as stub:
        monkeypatch.setenv("WEATHER_API_URL", stub.url)
        tools = load_tool_dir(EXAMPLES)
        assert [t.name for t in tools] == ["get_weather"]
        tool = tools[0]
        assert tool.to_tool().parameters == {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1, "description": 'City name, e.g. "Berlin".'},
                "unit": {"enum": ["celsius", "fahrenheit"], "default": "celsius"},
            },
            "required": ["city"],
            "additionalProperties": False,
        }
        assert tool.description.startswith(
            "Current weather for a city (temperature, conditions).\n\nUse this when"
        )
        assert get_permissions(tool) == ToolPermissions(scopes=frozenset({"private", "group"}))
        result = await run(tool, {"city": "Berlin"})
    assert stub.requests == [("POST", "/current", {"city": "Berlin", "unit": "celsius"})]
    assert isinstance(result, AgentToolResult)
    assert result.content == [TextContent(text='{"city": "Berlin", "temperature": 3, "conditions": "fog"}')]
    assert result.details == {"city": "Berlin", "temperature": 3, "conditions": "fog"}


async def test_example_rejects_bad_arguments_before_any_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEATHER_API_URL", "http://127.0.0.1:9")
    tool = load_tool_md(EXAMPLES / "weather.tool.md")
    with pytest.raises(ToolValidationError) as err:
        validate_tool_call([tool], ToolCall(id="c", name="get_weather", arguments={"city": "", "x": 1}))
    assert [loc for loc, _ in err.value.errors] == ["city", "x"]


async def test_http_error_status_raises_with_body(tmp_path: Path) -> None:
    with JsonStub(502, {"error": "upstream down"}) as stub:
        write(
            tmp_path,
            "t.tool.md",
            f"---\nname: t\ndescription: d\nhandler: {{type: http, url: '{stub.url}/x', method: GET}}\n"
            "parameters: {type: object, properties: {q: {type: string}, n: {type: integer}}}\n---\n",
        )
        tool = load_tool_md(tmp_path / "t.tool.md")
        with pytest.raises(RuntimeError) as err:
            await run(tool, {"q": "a b", "n": 2})
    assert str(err.value) == 'HTTP 502: {"error": "upstream down"}'
    assert stub.requests == [("GET", "/x?q=a+b&n=2", None)]


async def test_python_entry_points_sync_and_async(tmp_path: Path) -> None:
    write(
        tmp_path,
        "add.tool.md",
        "---\nname: add\ndescription: Add.\n"
        "parameters: {type: object, properties: {a: {type: integer}, b: {type: integer}}, required: [a, b]}\n"
        "handler: {type: python, entry_point: 'tests.session.handlers:add'}\n"
        "required_any_role: [master]\n---\n",
    )
    write(
        tmp_path,
        "shout.tool.md",
        "---\nname: shout\n"
        "parameters: {type: object, properties: {text: {type: string}}, required: [text]}\n"
        "handler: {type: python, entry_point: 'tests.session.handlers:shout'}\n---\nShout the text back.\n",
    )
    add, shout = load_tool_dir(tmp_path)
    result = await run(add, {"a": "2", "b": 3})
    assert isinstance(result, AgentToolResult)
    assert (result.content, result.details) == ([TextContent(text='{"sum": 5}')], {"sum": 5})
    assert await run(shout, {"text": "hi"}) == "HI"
    assert shout.description == "Shout the text back."
    assert get_permissions(add) == ToolPermissions(required_any_role=frozenset({"master"}))
    assert get_permissions(shout) is None


HANDLER = "handler: {type: python, entry_point: 'tests.session.handlers:add'}\n"

BAD_FILES = [
    ("no frontmatter", "just text\n", "no YAML frontmatter (the file must start with a '---' line and close it with '---')"),
    ("bad yaml", "---\nname: [x\n---\n", None),
    ("unknown key", f"---\nname: a\ndescription: d\nfoo: 1\n{HANDLER}---\n",
     "unknown frontmatter key(s) ['foo']; allowed: ['description', 'handler', 'name', 'parameters', 'platforms', "
     "'required_any_role', 'scopes']"),
    ("bad name", f"---\nname: 'a b'\ndescription: d\n{HANDLER}---\n", "name: 'a b' must match [a-zA-Z0-9_-]{1,64}"),
    ("no description", f"---\nname: a\n{HANDLER}---\n", "description: missing (give `description` or a Markdown body)"),
    ("no handler", "---\nname: a\ndescription: d\n---\n",
     "handler: expected {type: http, url: ...} or {type: python, entry_point: module:function}"),
    ("bad url", "---\nname: a\ndescription: d\nhandler: {type: http, url: 'ftp://x'}\n---\n",
     "handler.url: expected an http(s) URL, got 'ftp://x'"),
    ("handler key", "---\nname: a\ndescription: d\nhandler: {type: python, entry_point: 'm:f', url: 'x'}\n---\n",
     "handler: unknown key(s) ['url'] for type python; allowed: ['entry_point', 'type']"),
    ("import", "---\nname: a\ndescription: d\nhandler: {type: python, entry_point: 'tests.session.handlers:nope'}\n---\n",
     "handler.entry_point 'tests.session.handlers:nope' cannot be imported: module 'tests.session.handlers' "
     "has no attribute 'nope'"),
    ("not callable", "---\nname: a\ndescription: d\n"
     "handler: {type: python, entry_point: 'tests.session.handlers:NOT_CALLABLE'}\n---\n",
     "handler.entry_point 'tests.session.handlers:NOT_CALLABLE' is not callable"),
    ("env unset", "---\nname: a\ndescription: d\nhandler: {type: http, url: '${SESSIONRAY_NO_SUCH_VAR}/x'}\n---\n",
     "handler: environment variable SESSIONRAY_NO_SUCH_VAR is not set"),
    ("empty scopes", f"---\nname: a\ndescription: d\nscopes: []\n{HANDLER}---\n",
     "scopes: an empty list allows nobody; omit the key for no restriction"),
    ("unknown scope", f"---\nname: a\ndescription: d\nscopes: [room]\n{HANDLER}---\n",
     "scopes: unknown scope(s) ['room']; allowed: ['private', 'group', 'channel']"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "text", "message"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_file_fails_start_up_naming_the_file(
    tmp_path: Path, case: str, text: str, message: str | None
) -> None:
    path = write(tmp_path, "a.tool.md", text)
    with pytest.raises(ToolMdError) as err:
        load_tool_dir(tmp_path)
    assert err.value.file == str(path)
    if message is None:
        assert str(err.value).startswith(f"{path}: frontmatter is not valid YAML: ")
    else:
        assert str(err.value) == f"{path}: {message}"


def test_unsupported_schema_feature_stops_loading_with_pointer(tmp_path: Path) -> None:
    write(tmp_path, "a.tool.md", "---\nname: ok\ndescription: d\n" + HANDLER + "---\n")
    bad = write(tmp_path, "b.tool.md", "---\nname: b\ndescription: d\n" + HANDLER +
                "parameters:\n  type: object\n  properties:\n    tags:\n      type: object\n"
                "      patternProperties: {'^x': {type: string}}\n---\n")  # fmt: skip
    with pytest.raises(ToolMdError) as err:
        load_tool_dir(tmp_path)
    assert (err.value.file, err.value.pointer, err.value.feature) == (
        str(bad),
        "/parameters/properties/tags/patternProperties",
        "patternProperties",
    )
    assert str(err.value) == (
        f"{bad}: /parameters/properties/tags/patternProperties: unsupported JSON Schema feature "
        "'patternProperties'"
    )


def test_duplicate_names_and_missing_folder(tmp_path: Path) -> None:
    write(tmp_path, "a.tool.md", "---\nname: same\ndescription: d\n" + HANDLER + "---\n")
    second = write(tmp_path, "b.tool.md", "---\nname: same\ndescription: d\n" + HANDLER + "---\n")
    with pytest.raises(ToolMdError) as err:
        load_tool_dir(tmp_path)
    assert str(err.value) == f"{second}: tool name 'same' is already declared by {tmp_path / 'a.tool.md'}"
    with pytest.raises(ToolMdError) as err:
        load_tool_dir(tmp_path / "missing")
    assert str(err.value) == f"{tmp_path / 'missing'}: tools folder does not exist"
