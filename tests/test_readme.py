"""Every command the README shows in a ```sh block runs (a README that drifts from the program fails)."""
import re
import subprocess

import pytest

import run_c_source
from conftest import ROOT, RUN_BIN

# the README's commands run ./run itself; under the sanitizer build they add nothing
pytestmark = pytest.mark.skipif(RUN_BIN != str(ROOT / "run"), reason="README commands use ./run")


def readme_commands():
    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        commands += [line[2:] for line in block.splitlines() if line.startswith("$ ")]
    return commands


def test_readme_shows_commands():
    assert len(readme_commands()) >= 6


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_runs(command):
    # python3 in the README means a Python with numpy: the one the tests run with
    command = re.sub(r"^python3 ", "/usr/bin/python3 ", command)
    r = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=ROOT, capture_output=True, timeout=300,
                       env={"PATH": "/usr/bin:/bin", "MODELS": "models"})
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert r.stdout.strip(), "the command printed nothing"


def test_make_bench_runs_in_its_quick_form():
    # the README's `make bench`, as a one-run smoke test on the 15M shape (no timing is asserted)
    r = subprocess.run(["make", "-s", "bench", "BENCH_ARGS=--quick"], cwd=ROOT, capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert b"| 15M | 1 |" in r.stdout and b"read bandwidth" in r.stdout


def test_readme_and_docs_links_resolve():
    # the README sends readers to docs/ (and docs/ to each other): every relative link must name a file
    missing = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (page.parent / target.split("#")[0]).exists():
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert not missing, missing


# A reference to run.c is written "`name` (run.c:N)": the name, then the line it is on.
RUN_C_REFERENCE = re.compile(r"`(\w+)`\s+\(run\.c:(\d+)\)")  # the two may sit on two lines


def names_line(lines, n, name):
    """Line n (1-based) of run.c holds `name`: it names it, or opens the typedef that ends "} name;"."""
    if not 1 <= n <= len(lines):
        return False
    if re.search(rf"\b{name}\b", lines[n - 1]):
        return True
    if lines[n - 1].startswith("typedef"):
        closing = next((line for line in lines[n:] if line.startswith("}")), "")
        return re.match(rf"\}}\s*{name}\s*;", closing) is not None
    return False


def where_defined(lines, name):
    for i, line in enumerate(lines, 1):
        if re.match(rf"(static |int |__attribute__|typedef ).*\b{name}\b", line) or re.match(rf"\}}\s*{name}\s*;", line):
            return i
    return None


@pytest.mark.parametrize("page", ["README.md", "docs/reading.md"])
def test_run_c_line_references_name_their_line(page):
    # the README's shortest path and docs/reading.md's map give line numbers: each must
    # still land on the function or struct written beside it, so the map cannot drift
    lines = (ROOT / "run.c").read_text().split("\n")
    text = (ROOT / page).read_text()
    references = RUN_C_REFERENCE.findall(text)
    assert len(references) >= 10, f"{page}: expected the map's `name` (run.c:N) references"
    # every run.c:N on the page is in that form, so none escapes the check
    assert len(re.findall(r"run\.c:\w+", text)) - text.count("run.c:N`") == len(references), \
        f"{page}: write each line reference as `name` (run.c:N)"
    wrong = [f"`{name}` (run.c:{n}): line {n} is {lines[int(n) - 1].strip()[:60]!r}"
             f" (defined at run.c:{where_defined(lines, name)})" if int(n) <= len(lines) else f"run.c:{n}: past the end"
             for name, n in references if not names_line(lines, int(n), name)]
    assert not wrong, "\n".join(wrong)


def test_a_learner_reaches_the_forward_pass_within_run_cs_first_700_lines():
    # the forward pass (its section, then forward_block) before the loading machinery, as
    # llama2.c's run.c has it, and forward_block within the first 700 lines
    lines = run_c_source.run_c_lines()
    section = next(i for i, line in enumerate(lines, 1) if line.startswith("// The forward pass:"))
    loading = next(i for i, line in enumerate(lines, 1) if line.startswith("// Loading a checkpoint"))
    forward_block = next(i for i, line in enumerate(lines, 1) if line.startswith("static float *forward_block("))
    assert section < forward_block <= 700 and forward_block < loading, (section, forward_block, loading)


def test_a_learner_meets_at_most_90_names_before_the_forward_pass():
    # every top-level name defined above forward_block (functions, prototypes, macros, enum
    # constants, types, globals: each once), against llama2.c's 13: the names the model does
    # not use wait for their first use
    names = run_c_source.top_level_names(run_c_source.run_c_lines())
    forward_block = next(n.line for n in names if n.kind == "function" and n.name == "forward_block")
    before = sorted({n.name for n in names if n.line < forward_block})
    assert len(before) <= 90, f"{len(before)} names before forward_block: {before}"
