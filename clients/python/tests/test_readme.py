"""The quick starts of README.md ("Python") and of the client's own README, its volumes and
paused sessions examples and docs/python.md's background executions, run as written against
the test server, and print what their comments say."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

from conftest import KEY, ROOT, Server


def python_block(readme: pathlib.Path, after: str) -> str:
    text = readme.read_text()
    start = text.index(after)
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match, f"no python block after {after!r} in {readme}"
    return match.group(1)


def run(code: str, server: Server) -> list[str]:
    code = code.replace("http://127.0.0.1:8080", server.url).replace('"ak_..."', "KEY")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README", "exec"), {"KEY": KEY})  # the project's own documentation
    return out.getvalue().splitlines()


def test_the_readme_quick_start(server: Server) -> None:
    lines = run(python_block(ROOT / "README.md", "\n## Python\n"), server)
    assert lines == ["ok hello", " 42", "{1, 2}", "3"]


def test_the_client_readme_quick_start(server: Server) -> None:
    lines = run(python_block(ROOT / "clients" / "python" / "README.md", "\n## Quick start\n"), server)
    assert lines[:4] == ["ok hello", " 42", "42", "11"]
    # One output event per print half a second apart, as the comment says, then the Execution.
    assert lines[4:7] == [f"OutputEvent(stream='stdout', text='{i}\\n')" for i in range(3)], lines
    assert len(lines) == 8, lines
    assert lines[7].startswith("Execution(") and "stdout='0\\n1\\n2\\n'" in lines[7]


def test_the_client_readme_volumes_example(server: Server) -> None:
    lines = run(python_block(ROOT / "clients" / "python" / "README.md", "\n## Volumes\n"), server)
    assert lines == ["6 b'6'", "['in', 'in/numbers.txt', 'total.txt']", "volume_busy", "6", "3"]


def test_the_client_readme_paused_sessions_example(server: Server) -> None:
    lines = run(python_block(ROOT / "clients" / "python" / "README.md", "\n## Paused sessions\n"), server)
    assert lines == ["['rows', 'threading'] ['lock']", "6 True", "[1, 2, 3, 4] [1, 2, 3]", "True True"]


def test_the_background_executions_example(server: Server) -> None:
    lines = run(python_block(ROOT / "docs" / "python.md", "\n## Background executions\n"), server)
    assert lines[:3] == ["queued", "0", "1"], lines
    assert lines[3:5] == [f"OutputEvent(stream='stdout', text='{i}\\n')" for i in (2, 3)], lines
    assert lines[5].startswith("Execution(") and "output_streamed=True" in lines[5]
    assert lines[6:] == ["0", "1", "2", "3", " 42", "cancelled", "cancelled"], lines
