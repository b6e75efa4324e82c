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


# A reference to run.c is written "`name` (run.c:N)": the name, then the line its definition
# starts on.
RUN_C_REFERENCE = re.compile(r"`(\w+)`\s+\(run\.c:(\d+)\)")  # the two may sit on two lines

# the sections of the model, whose every function and type docs/reading.md lists
MODEL_SECTIONS = ["// Transformer model", "// Rotary position embeddings", "// The forward pass",
                  "// Past the training length", "// Errors", "// Shifting the KV cache", "// The sampler"]


def definitions(lines):
    """name -> the lines where a definition of it starts: a function's (not a prototype), a
    type's, a macro's, an enum constant's, a global's, a struct member's"""
    found = {}
    for n in run_c_source.top_level_names(lines):
        if n.kind != "prototype":
            found.setdefault(n.name, []).append(n.line)
    for field, line in run_c_source.struct_fields(lines):
        found.setdefault(field, []).append(line)
    return found


@pytest.mark.parametrize("page", ["README.md", "docs/reading.md"])
def test_run_c_line_references_are_the_definitions(page):
    # the README's shortest path and docs/reading.md's map give line numbers: each must land
    # on where the name written beside it is defined (not on a prototype or a use), so the
    # map cannot drift
    lines = run_c_source.run_c_lines()
    text = (ROOT / page).read_text()
    references = RUN_C_REFERENCE.findall(text)
    assert len(references) >= 10, f"{page}: expected the map's `name` (run.c:N) references"
    # every run.c:N on the page is in that form, so none escapes the check
    assert len(re.findall(r"run\.c:\w+", text)) - text.count("run.c:N`") == len(references), \
        f"{page}: write each line reference as `name` (run.c:N)"
    defined = definitions(lines)
    wrong = [f"`{name}` (run.c:{n}): line {n} is {lines[int(n) - 1].strip()[:60] if int(n) <= len(lines) else 'past the end'!r}"
             f" (defined at run.c:{', '.join(map(str, defined.get(name, []))) or 'nowhere'})"
             for name, n in references if int(n) not in defined.get(name, [])]
    assert not wrong, "\n".join(wrong)


def test_docs_reading_lists_every_function_and_type_of_the_model():
    lines = run_c_source.run_c_lines()
    listed = {name for name, _ in RUN_C_REFERENCE.findall((ROOT / "docs" / "reading.md").read_text())}
    names = run_c_source.top_level_names(lines)
    missing = []
    for banner in MODEL_SECTIONS:
        first, last = run_c_source.section_lines(lines, banner)
        missing += [f"{banner[3:]}: {n.name}" for n in names
                    if n.kind in ("function", "type") and first <= n.line <= last and n.name not in listed]
    assert not missing, missing


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
