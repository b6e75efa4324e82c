"""run.c's top-level names as its text defines them, for the tests that check maps of the file
(tests/test_readme.py) and which functions a section holds (tests/test_plain_run.py).

A name is what a C file declares at its top level: a function (its definition, or a prototype),
a macro (#define), an enum constant, a type (a typedef, or a struct's tag), a global. Each comes
with the line its declaration starts on (a multi-line signature or struct: its first line)."""
import re
from collections import namedtuple

from conftest import ROOT

Name = namedtuple("Name", "kind name line")  # kind: function, prototype, macro, enum constant, type, global


def run_c_lines():
    return (ROOT / "run.c").read_text().split("\n")


def _blank(text):
    """text with its comments, strings and character constants blanked out, lines kept"""
    def keep_lines(m):
        return "\n" * m.group().count("\n")
    text = re.sub(r"/\*.*?\*/", keep_lines, text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"'(\\.|[^'\\\n])+'", "0", text)
    return re.sub(r'"(\\.|[^"\\\n])*"', '""', text)


def _declarator_name(head):
    """the identifier before a declarator's parameter list (its last top-level parentheses)"""
    head = head.rstrip().rstrip(";").rstrip()
    depth, i = 0, len(head) - 1
    while i >= 0:
        depth += {")": 1, "(": -1}.get(head[i], 0)
        if head[i] == "(" and depth == 0:
            break
        i -= 1
    return re.search(r"(\w+)\s*$", head[:i]).group(1)


def _split_top(s):
    parts, depth, cur = [], 0, ""
    for ch in s:
        depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def _declaration(decl, bodies, line):
    """the names a top-level declaration ending in ';' introduces; bodies: its {...} parts"""
    d = re.sub(r"\s+", " ", decl).strip()
    if not d:
        return []
    names = []
    head = d.split("{")[0]
    if re.search(r"\benum\b", head) and bodies:
        names += [Name("enum constant", m.group(1), line)
                  for m in (re.match(r"\s*(\w+)", item) for item in bodies[0].split(",")) if m]
    if d.startswith("typedef"):
        name = re.search(r"(\w+)\s*$", d).group(1)
        tag = re.match(r"typedef (?:struct|union|enum) (\w+)", d)
        names.append(Name("type", name, line))
        if tag and tag.group(1) != name:
            names.append(Name("type", tag.group(1), line))
        return names
    tag = re.match(r"(?:struct|union|enum) (\w+) ?\{\}$", d)
    if tag:
        return [Name("type", tag.group(1), line)]
    if names and re.match(r"(?:static )?enum ?\{\}$", d):
        return names
    before_value = d.split("=")[0]
    if "(" in before_value and not re.search(r"\(\s*\*", before_value):
        return [Name("prototype", _declarator_name(before_value), line)]
    for part in _split_top(re.sub(r"\{\}", "", d)):
        m = re.search(r"(\w+)\s*$", re.sub(r"\[[^\]]*\]", "", part.split("=")[0]).strip())
        if m:
            names.append(Name("global", m.group(1), line))
    return names


def top_level_names(lines):
    """Every top-level name of the C source `lines`, in file order."""
    text = _blank("\n".join(lines))
    names, decl, bodies, start = [], "", [], None
    i, line, depth, at_line_start = 0, 1, 0, True
    while i < len(text):
        ch = text[i]
        if at_line_start and depth == 0 and text[i:].lstrip(" \t").startswith("#"):
            end = i  # a directive, with its continuation lines
            while True:
                end = text.find("\n", end)
                if end < 0 or text[end - 1] != "\\":
                    break
                end += 1
            end = len(text) if end < 0 else end
            m = re.match(r"\s*#\s*define\s+(\w+)", text[i:end])
            if m:
                names.append(Name("macro", m.group(1), line))
            line += text[i:end].count("\n")
            i = end
            continue
        at_line_start = ch == "\n"
        line += ch == "\n"
        if depth == 0 and not decl.strip() and not ch.isspace():
            start = line
        if depth == 0 and ch == "{" and re.sub(r"\s+", " ", decl).strip().endswith(")") \
                and "=" not in decl.split("(")[0]:
            names.append(Name("function", _declarator_name(decl), start))
            j, d = i + 1, 1  # skip the body
            while d:
                d += {"{": 1, "}": -1}.get(text[j], 0)
                line += text[j] == "\n"
                j += 1
            i, decl = j, ""
            continue
        if depth == 0 and ch == ";":
            names += _declaration(decl, bodies, start)
            decl, bodies = "", []
        elif depth == 0 and ch == "{":
            depth, body = 1, ""
            decl += "{"
        elif depth == 0:
            decl += ch
        else:
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if depth == 0:
                bodies.append(body)
                decl += "}"
            else:
                body += ch
        i += 1
    return names


def struct_fields(lines):
    """(field, line) of each member declared in a top-level struct of `lines`"""
    text = _blank("\n".join(lines)).split("\n")
    fields, inside = [], False
    for n, code in enumerate(text, 1):
        if re.match(r"(typedef )?struct\b[^;]*\{\s*$", code):
            inside = True
        elif inside and code.startswith("}"):
            inside = False
        elif inside and ";" in code and "(" not in code:
            for part in _split_top(code.split(";")[0]):
                m = re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", part)
                if m:
                    fields.append((m.group(1), n))
    return fields


def section_lines(lines, banner):
    """(first, last) line numbers of the section whose banner line starts with `banner`: from
    it to the line before the next "// ---" rule."""
    first = next(i for i, text in enumerate(lines, 1) if text.startswith(banner))
    rule = next(i for i in range(first, len(lines) + 1) if lines[i - 1].startswith("// ----"))
    return first, rule - 1


def functions_in(lines, banner):
    """The functions a section defines: their names, in order."""
    first, last = section_lines(lines, banner)
    return [n.name for n in top_level_names(lines) if n.kind == "function" and first <= n.line <= last]
