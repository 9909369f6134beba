"""The documentation: generated parts match the code, the site builds strictly, and every command
shown in it is exercised.

Convention: commands live in fenced ```console blocks, one per line after `$ `; lines without `$ `
are the output they print (each shown line must appear in the real output; `...` skips lines).
Commands in one block run in order in a fresh directory that holds a `train.py`. A command runs
for real when it can run here (`traceml run` with `--print-config` added, `traceml slurm template`,
`traceml slurm env`); the others are checked by parsing (`sbatch FILE`: the file exists and passes
`bash -n`; `srun ...`: one task per node, and its `traceml run` part resolves; `pip install`/`pip
wheel`: our distribution (name, checkout or wheel of this version) and its extras, or a package of an
extra; `git clone`: into `traceml-slurm`; `traceml slurm doctor`: its own parser, since it needs an allocation). A command no checker knows fails the test: keep
commands in the docs few, and add a checker when a new kind is needed. ```bash blocks must pass
`bash -n`; the template page's ```toml blocks must load as presets.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[a-z]*)\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)

sys.path.insert(0, str(ROOT / "scripts"))
import gen_docs  # noqa: E402


def blocks(lang: str):
    for page in sorted(DOCS.rglob("*.md")):
        for m in FENCE.finditer(page.read_text(encoding="utf-8")):
            if m.group("lang") == lang:
                body = "\n".join(line[len(m.group("indent")):] for line in m.group("body").splitlines())
                yield pytest.param(page.relative_to(ROOT), body, id=f"{page.name}:{m.start()}")


CONSOLE = list(blocks("console"))


def test_generated_docs_match_the_code(capsys):
    code = gen_docs.main(["--check"])
    assert code == 0, capsys.readouterr().err


def test_every_traceml_variable_in_the_code_is_documented():
    from traceml_core.options import OPTIONS

    documented = {o.env for o in OPTIONS} | set(gen_docs.OTHER_VARIABLES) | set(gen_docs.NOT_VARIABLES)
    used = set()
    for path in (ROOT / "src").rglob("*.py"):
        used |= set(re.findall(r"\bTRACEML_[A-Z][A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")))
    missing = sorted(used - documented)
    assert not missing, f"document these in scripts/gen_docs.py OTHER_VARIABLES (or the option table): {missing}"


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed (pip install '.[docs]')")
def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # mkdocs checks anchors of links to other pages only; check the links within a page here.
    # A bare <word> in the markdown becomes an HTML tag and swallows text (or the page): catch it.
    broken = []
    for html in site.rglob("*.html"):
        page = _Anchors()
        page.feed(html.read_text(encoding="utf-8"))
        broken += [f"{html.relative_to(site)}: #{a}" for a in page.local_links - page.ids]
        broken += [f"{html.relative_to(site)}: <{t}>" for t in page.tags - HTML_TAGS]
    assert not broken, broken


HTML_TAGS = set("a blockquote body br button code div em footer form h1 h2 h3 h4 h5 h6 head hr html i input kbd li link meta nav "
                "ol p pre script span strong table tbody td th thead title tr ul img section header".split())


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.local_links: set[str] = set()
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        href = a.get("href") or ""
        if tag == "a" and href.startswith("#") and len(href) > 1:
            self.local_links.add(href[1:])


@pytest.mark.parametrize("page,body", list(blocks("bash")))
def test_bash_blocks_parse(page, body):
    proc = subprocess.run(["bash", "-n"], input=body + "\n", capture_output=True, text=True)
    assert proc.returncode == 0, f"{page}: {proc.stderr}"


@pytest.mark.parametrize("page,body", [b for b in blocks("toml") if b.values[0].name == "template.md"])
def test_toml_blocks_of_the_template_page_are_valid_presets(page, body):
    import tomllib

    from traceml_slurm.template.presets import from_mapping

    preset = from_mapping("doc", tomllib.loads(body))
    assert preset.values


def test_docs_show_commands():
    assert len(CONSOLE) >= 5


@pytest.mark.parametrize("page,body", CONSOLE)
def test_console_commands(page, body, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    for name in list(os.environ):
        if name.startswith(("SLURM_", "TRACEML_")):  # run as on a machine outside any job
            monkeypatch.delenv(name)
    steps = _commands(body)
    assert steps, f"{page}: a console block without a `$ ` command"
    for command, shown in steps:
        argv = shlex.split(command)
        checker = CHECKERS.get(argv[0])
        assert checker, f"{page}: no checker for `{command}`; see this test's docstring"
        out = checker(argv, tmp_path, capsys)
        if shown:
            _assert_shown(page, command, shown, out)


def _commands(body: str) -> list[tuple[str, list[str]]]:
    steps: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps and line.strip():
            steps[-1][1].append(line)
    return steps


def _assert_shown(page, command, shown, out):
    actual = [" ".join(line.split()) for line in out.splitlines()]
    for line in shown:
        if line.strip() == "...":
            continue
        assert " ".join(line.split()) in actual, f"{page}: `{command}` does not print {line!r}; it printed:\n{out}"


def _traceml(argv, tmp_path, capsys):
    from traceml_core.cli import main

    args = argv[1:]
    if args[:1] == ["run"] and not {"--help", "-h", "--print-config"} & set(args):
        args = ["run", "--print-config", *args[1:]]  # resolve the launch fully, start nothing
    if args[:2] == ["slurm", "doctor"]:
        return _doctor(args[2:])
    if args[:1] in (["compare"], ["report"]):  # they need finished runs: parsed only
        from traceml_core.cli import build_parser

        build_parser()[0].parse_args(args)
        return ""
    capsys.readouterr()
    try:
        code = main(args)
    except SystemExit as done:  # --help
        code = done.code or 0
    out, err = capsys.readouterr()
    assert code == 0, f"`{shlex.join(argv)}` exited {code}: {err}"
    return out


def _doctor(args):
    from traceml_slurm.doctor.cli import build_parser

    build_parser().parse_args(args)  # it needs an allocation to run; its parser checks the command
    return ""


def _sbatch(argv, tmp_path, capsys):
    paths = [a for a in argv[1:] if not a.startswith("-")]
    assert len(paths) == 1, argv
    path = next((base / paths[0] for base in (tmp_path, ROOT) if (base / paths[0]).is_file()), None)
    assert path is not None, f"sbatch {paths[0]}: no such file (made by an earlier command of the block, or in the repo)"
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "--ntasks-per-node=1" in path.read_text()
    return ""


def _srun(argv, tmp_path, capsys):
    assert "--ntasks-per-node=1" in argv, "srun lines in the docs start one launcher per node"
    if "traceml" in argv:
        return _traceml(argv[argv.index("traceml"):], tmp_path, capsys)
    return ""


def _pip(argv, tmp_path, capsys):
    """`pip install X` or `pip wheel ... X` where X is our distribution: its name, a checkout of it
    (`./traceml-slurm`, the directory the `git clone` line makes) or the wheel built from it (this
    version), each with extras we have; or a package one of our extras brings in."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    argv = argv[:argv.index("#")] if "#" in argv else argv
    assert argv[1] in ("install", "wheel"), argv
    m = re.fullmatch(r"([A-Za-z0-9_./-]+)(?:\[([a-z0-9,_-]+)\])?", argv[-1])
    assert m, argv
    target, extras = m.group(1), set((m.group(2) or "").split(",")) - {""}
    assert extras <= set(project["optional-dependencies"]), extras
    wheel = f"{project['name'].replace('-', '_')}-{project['version']}-py3-none-any.whl"
    if target in (project["name"], f"./{project['name']}") or target == f"dist/{wheel}":
        return ""
    brought = {re.split(r"[<>=!\[ ;]", req, 1)[0] for reqs in project["optional-dependencies"].values() for req in reqs}
    assert argv[1] == "install" and not extras and target in brought, (
        f"{argv}: not our distribution ({project['name']}, ./{project['name']}, dist/{wheel}) nor a package of our extras")
    return ""


def _git(argv, tmp_path, capsys):
    """`git clone <the repository> traceml-slurm`: the directory the install lines use."""
    assert argv[1] == "clone" and argv[-1] == "traceml-slurm", argv
    return ""


def _python(argv, tmp_path, capsys):
    assert argv[1:2] == ["scripts/gen_docs.py"], argv
    assert gen_docs.main(["--check"]) == 0
    return ""


CHECKERS = {"traceml": _traceml, "sbatch": _sbatch, "srun": _srun, "pip": _pip, "python": _python, "git": _git}
