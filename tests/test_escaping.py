"""Strings from a trace never become markup: Markdown (findings.md, diff.md, job_findings.md),
HTML (report.html), SQL LIKE (``catalog query --findings``).

The Markdown outputs are parsed with markdown-it (CommonMark + GFM tables; installed with rich):
a hostile name must give no raw HTML, no link or image of its own, no emphasis, and no table
row with an extra cell, and it must still read as itself.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO_ROOT
from markdown_it import MarkdownIt

from nsysan.api import analyze_to_dir

HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(2)>",
    "[click](javascript:alert(3))",
    "<!-- comment",
    "a`b``c",
    "`lead",
    "trail`",
    "pipe | in | name",
    "*em* _u_ ~~s~~",
    "&amp; &lt;b&gt;",
    "line\n\n# heading\n| x |",
    "\\| backslash pipe",
    "![img](x.png)",
    "<https://example.com>",
    "\x1b[31mred",
]
#: appended to every kernel / API / NVTX name of the fixture in `hostile_trace`
SUFFIX = (" <script>alert(1)</script> <img src=x onerror=alert(2)> [c](javascript:alert(3)) "
          "<!-- x ` y `` z | w *em* _u_ &amp; \n\n# h\n| t |")
MD = MarkdownIt("commonmark").enable("table")
#: the links and pictures nsysan itself puts into findings.md
OWN_TARGETS = re.compile(r"^(report\.html|layers\.png|timeline_device\d+\.png|"
                         r"diff_decomposition\.png)$")


def _tokens(text: str) -> list:
    out = []

    def walk(tokens: list) -> None:
        for t in tokens:
            out.append(t)
            if t.children:
                walk(t.children)

    walk(MD.parse(text))
    return out


#: the emphasised words nsysan itself writes (diff.md verdicts and item kinds)
OWN_EMPHASIS = {"not comparable", "(idle)", "Method"}


def assert_inert(markdown: str, where: str) -> None:
    """No markup came from a trace string: no raw HTML, no foreign links or images, no
    emphasis but nsysan's own, every table row as wide as its header."""
    tokens = _tokens(markdown)
    kinds = {t.type for t in tokens}
    assert not kinds & {"html_inline", "html_block", "s_open"}, where
    for i, t in enumerate(tokens):
        if t.type == "em_open":
            assert tokens[i + 1].content in OWN_EMPHASIS, f"{where}: emphasis {tokens[i + 1]}"
    for t in tokens:
        if t.type in ("link_open", "image"):
            target = t.attrs.get("href") or t.attrs.get("src")
            assert OWN_TARGETS.match(str(target)), f"{where}: link to {target!r}"
    width = None
    for t in tokens:
        if t.type == "thead_open":
            width, cells = None, 0
        elif t.type in ("th_open", "td_open"):
            cells += 1
        elif t.type == "tr_open":
            cells = 0
        elif t.type == "tr_close":
            if width is None:
                width = cells
            assert cells == width, f"{where}: a table row has {cells} cells, not {width}"
    html = MD.render(markdown)
    assert "<script" not in html and "<img src=x" not in html, where
    assert "\x1b" not in markdown, f"{where}: a terminal escape sequence"


# ---------------------------------------------------------------------------------------------
# the helpers
# ---------------------------------------------------------------------------------------------
def _one_line(s: str) -> str:
    return " ".join(s.split()).replace("\x1b", "\\x1b")


@pytest.mark.parametrize("name", HOSTILE)
def test_code_span_shows_the_name_literally(name: str) -> None:
    from nsysan.escape import like_escape, like_glob, md_cell, md_code, md_text  # noqa: F401

    text = f"before {md_code(name)} after"
    assert_inert(text, repr(name))
    codes = [t for t in _tokens(text) if t.type == "code_inline"]
    assert [t.content for t in codes] == [_one_line(name)]


@pytest.mark.parametrize("name", HOSTILE)
def test_table_cells_keep_their_column(name: str) -> None:
    from nsysan.escape import like_escape, like_glob, md_cell, md_code, md_text  # noqa: F401

    table = ("| a | b | c |\n|---|---|---|\n"
             f"| {md_text(name)} | {md_code(name, in_table=True)} | "
             f"{md_cell('see ' + md_code(name))} |\n")
    assert_inert(table, repr(name))
    cells = [t for t in _tokens(table) if t.type == "inline"][3:]
    assert len(cells) == 3
    assert cells[0].children and "".join(c.content for c in cells[0].children) == _one_line(name)
    assert [c.content for c in cells[1].children if c.type == "code_inline"] == [_one_line(name)]
    assert [c.content for c in cells[2].children if c.type == "code_inline"] == [_one_line(name)]


@pytest.mark.parametrize("name", HOSTILE)
def test_heading_and_list_item_text(name: str) -> None:
    from nsysan.escape import like_escape, like_glob, md_cell, md_code, md_text  # noqa: F401

    doc = f"# nsysan findings — {md_text(name)}\n\n- item: {md_text(name)}\n"
    assert_inert(doc, repr(name))
    inline = [t for t in _tokens(doc) if t.type == "inline"]
    assert "".join(c.content for c in inline[0].children) == "nsysan findings — " + _one_line(name)


def test_limits_cut_before_escaping() -> None:
    from nsysan.escape import like_escape, like_glob, md_cell, md_code, md_text  # noqa: F401

    assert md_text("<" * 10, limit=4) == "\\<\\<\\<…"
    assert md_code("a" * 10, limit=4) == "`aaa…`"


def test_like_patterns_escape_wildcards() -> None:
    from nsysan.escape import like_escape, like_glob, md_cell, md_code, md_text  # noqa: F401

    assert like_escape("100%_a\\b") == "100\\%\\_a\\\\b"
    assert like_glob("GPU_*") == "GPU\\_%"
    assert like_glob("%") == "\\%"


# ---------------------------------------------------------------------------------------------
# end to end: a trace whose every name is hostile
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hostile_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hostile") / "hostile.sqlite"
    shutil.copyfile(REPO_ROOT / "fixtures" / "example_ddp.sqlite", path)
    path.chmod(0o644)
    con = sqlite3.connect(path)
    con.execute("UPDATE StringIds SET value = value || ?", (SUFFIX,))
    # (not the step ranges: the steps must still be found, so that diffs decompose by layer)
    con.execute("UPDATE NVTX_EVENTS SET text = text || ? WHERE text NOT LIKE 'step%'", (SUFFIX,))
    con.commit()
    con.close()
    return path


@pytest.fixture(scope="module")
def hostile_out(hostile_trace: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    _, out = analyze_to_dir(hostile_trace, tmp_path_factory.mktemp("out"))
    return out


def test_findings_md_is_inert(hostile_out: Path) -> None:
    text = (hostile_out / "findings.md").read_text()
    assert "alert(1)" in text  # the names are there...
    assert "javascript" in text
    assert_inert(text, "findings.md")  # ...as text
    rendered = MD.render(text)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered


def test_report_html_escapes(hostile_out: Path) -> None:
    html = (hostile_out / "report.html").read_text()
    assert "alert(1)" in html
    # the page's own three script elements (its JSON data, its code, its base64 raw ops) and
    # no other markup
    assert html.count("<script") == 3 and html.count("</script") == 3
    assert "<img" not in html and "<!-- x" not in html
    assert "&lt;script&gt;" in html
    import json
    import re

    data = re.search(r"<script type='application/json' id='nsysan-data'>(.*?)</script>",
                     html, re.S).group(1)
    assert "<" not in data and ">" not in data and "&" not in data
    assert any(SUFFIX in s for s in json.loads(data)["strings"])  # names intact once parsed


def test_findings_json_keeps_the_names(hostile_out: Path) -> None:
    import json

    doc = json.loads((hostile_out / "findings.json").read_text())
    names = [o["name"] for f in doc["findings"] for o in f["evidence"]["offenders"]]
    assert any(SUFFIX in n for n in names)  # JSON escapes by construction: names unchanged


def test_diff_md_is_inert(hostile_trace: Path, hostile_out: Path, tmp_path: Path) -> None:
    from nsysan.cli import cli

    res = CliRunner().invoke(cli, ["diff", str(hostile_out), str(hostile_out),
                                    "-o", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    text = (tmp_path / "d" / "diff.md").read_text()
    assert "alert(" in text
    assert_inert(text, "diff.md")


def test_diff_picture_does_not_parse_names_as_math(tmp_path: Path) -> None:
    """A layer named like a TeX formula broke the decomposition picture (mathtext)."""
    from nsysan.compare.diff import diff
    from nsysan.compare.render import decomposition_png

    src = tmp_path / "tex.sqlite"
    shutil.copyfile(REPO_ROOT / "fixtures" / "example_ddp.sqlite", src)
    src.chmod(0o644)
    con = sqlite3.connect(src)
    con.execute("UPDATE NVTX_EVENTS SET text = text || ' $\\frac{$' WHERE text NOT LIKE 'step%'")
    con.commit()
    con.close()
    from nsysan.api import analyze
    from nsysan.compare.metrics import from_result

    a = from_result(analyze(src))
    assert decomposition_png(diff(a, a), tmp_path / "d.png") is not None


def test_catalog_findings_pattern_is_not_a_sql_wildcard(tmp_path: Path) -> None:
    from test_catalog import finding, record

    from nsysan.batch import queries
    from nsysan.batch.catalog import Catalog

    with Catalog(f"sqlite:///{tmp_path / 'c.db'}") as cat:
        cat.record(record("a.sqlite", "b1", findings=[finding("GPU_IDLE", 1, 0),
                                                      finding("GPUXIDLE", 2, 1)]))
        assert queries.findings_of(cat, "%").rows == []
        assert queries.findings_of(cat, "GPU_IDLE%").rows == []
        got = {r["code"] for r in queries.findings_of(cat, "gpu_*").records()}
        assert got == {"GPU_IDLE"}  # "_" is itself, not "any one character"
        assert {r["code"] for r in queries.findings_of(cat, "*").records()} == {
            "GPU_IDLE", "GPUXIDLE"}
