#!/usr/bin/env python3
"""Generate uroce's exported-symbol surface from src/verbs/abi_symbols.txt.

Writes three files, all committed (the build never runs this script):

  src/verbs/uroce.map        GNU ld version script: every node of Debian's
                             libibverbs.so.1 / librdmacm.so.1 with the same
                             inheritance, every default (NAME@@NODE) symbol,
                             and `local: *;` for everything else.
  src/verbs/abi_stubs.cc     weak "not supported" definitions of every
                             libibverbs symbol, plus the compat (NAME@NODE)
                             entries bound with .symver.
  src/rdmacm/abi_stubs.cc    the same for librdmacm.

Input format (one entry per line, `#` starts a comment):

  %version NODE [PARENT]
  NAME VERSION default|compat KIND

`default` exports NAME as NAME@@VERSION: the plain C name, which the real
implementation elsewhere in the library defines strongly and so overrides the
weak stub.  `compat` exports NAME@VERSION only (a hidden, non-default
version): it gets its own internal stub, bound with .symver, that nothing
overrides.  Shell-style quoting is allowed (for KIND strings with spaces).

KIND is one of
  TYPE:errno[:E]      return E (positive errno; rdma-core's verbs convention)
  TYPE:neg_errno[:E]  return -E
  TYPE:m1[:E]         errno = E; return -1  (size: (size_t)-1)
  TYPE:zero           return 0 (a neutral answer, no error channel)
  ptr:null[:E]        errno = E; return NULL
  str:TEXT            return "TEXT" (infallible string getters)
  void                do nothing
  data:bool           a bool object initialised to false
with TYPE in int, uint, u16, u64, ssize, off, size and E an errno name
(default EOPNOTSUPP).

Usage: scripts/gen_abi_stubs.py [--check]
  --check  write nothing; exit 1 if any output file is out of date.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "src/verbs/abi_symbols.txt"
MAP = ROOT / "src/verbs/uroce.map"
STUBS = {
    "IBVERBS": ROOT / "src/verbs/abi_stubs.cc",
    "RDMACM": ROOT / "src/rdmacm/abi_stubs.cc",
}
LIBNAME = {"IBVERBS": "libibverbs.so.1", "RDMACM": "librdmacm.so.1"}

C_TYPES = {
    "int": "int",
    "uint": "unsigned int",
    "u16": "std::uint16_t",
    "u64": "std::uint64_t",
    "ssize": "ssize_t",
    "off": "off_t",
    "size": "std::size_t",
    "ptr": "void *",
    "str": "const char *",
}
ERRNO_NAME = re.compile(r"^E[A-Z0-9]+$")
C_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ListError(Exception):
    pass


@dataclass(frozen=True)
class Symbol:
    name: str
    version: str
    default: bool
    kind: str
    line: int

    @property
    def family(self) -> str:
        return "RDMACM" if self.version.startswith("RDMACM_") else "IBVERBS"

    @property
    def compat_name(self) -> str:
        return "uroce_compat_%s_%s" % (self.name, re.sub(r"[^A-Za-z0-9]", "_", self.version))


def parse(path: Path):
    nodes: list[tuple[str, str | None]] = []
    syms: list[Symbol] = []
    for no, raw in enumerate(path.read_text().splitlines(), 1):
        try:
            toks = shlex.split(raw, comments=True)
        except ValueError as e:
            raise ListError("%s:%d: %s" % (path, no, e))
        if not toks:
            continue
        if toks[0] == "%version":
            if len(toks) not in (2, 3):
                raise ListError("%s:%d: expected '%%version NODE [PARENT]'" % (path, no))
            nodes.append((toks[1], toks[2] if len(toks) == 3 else None))
            continue
        if len(toks) != 4 or toks[2] not in ("default", "compat"):
            raise ListError("%s:%d: expected 'NAME VERSION default|compat KIND'" % (path, no))
        if not C_NAME.match(toks[0]):
            raise ListError("%s:%d: bad symbol name %r" % (path, no, toks[0]))
        syms.append(Symbol(toks[0], toks[1], toks[2] == "default", toks[3], no))

    known = [n for n, _ in nodes]
    if len(set(known)) != len(known):
        raise ListError("duplicate %version node")
    for n, parent in nodes:
        if parent is not None and parent not in known:
            raise ListError("node %s inherits from undeclared %s" % (n, parent))
    seen: dict[tuple[str, str], Symbol] = {}
    defaults: dict[str, Symbol] = {}
    for s in syms:
        if s.version not in known:
            raise ListError("line %d: %s uses undeclared node %s" % (s.line, s.name, s.version))
        if (s.name, s.version) in seen:
            raise ListError("line %d: %s@%s listed twice" % (s.line, s.name, s.version))
        seen[(s.name, s.version)] = s
        if s.default:
            if s.name in defaults:
                raise ListError("line %d: %s has two default versions" % (s.line, s.name))
            defaults[s.name] = s
        if s.kind.startswith("data:") and not s.default:
            raise ListError("line %d: compat data objects are not supported" % s.line)
        stub_body(s)  # validates KIND
    return nodes, syms


def c_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif 32 <= ord(ch) < 127:
            out.append(ch)
        else:
            raise ListError("non-ASCII/control character in string kind")
    return '"' + "".join(out) + '"'


def decl(ctype: str, name: str) -> str:
    return ctype + name if ctype.endswith("*") else ctype + " " + name


def stub_body(s: Symbol) -> tuple[str, str]:
    """Return (C return type, body) for a function stub; ('', init) for data."""
    kind = s.kind
    if kind == "void":
        return "void", "{}"
    if kind == "data:bool":
        return "", "bool"
    if kind.startswith("str:"):
        return C_TYPES["str"], "{ return %s; }" % c_string(kind[4:])
    parts = kind.split(":")
    if len(parts) not in (2, 3) or parts[0] not in C_TYPES or parts[0] == "str":
        raise ListError("line %d: bad KIND %r" % (s.line, kind))
    ctype, conv = C_TYPES[parts[0]], parts[1]
    err = parts[2] if len(parts) == 3 else "EOPNOTSUPP"
    if not ERRNO_NAME.match(err):
        raise ListError("line %d: bad errno name %r" % (s.line, err))
    is_ptr = parts[0] == "ptr"
    if conv == "null" and is_ptr:
        return ctype, "{ errno = %s; return nullptr; }" % err
    if is_ptr:
        raise ListError("line %d: pointers only support ptr:null" % s.line)
    if conv == "errno":
        return ctype, "{ return %s; }" % err
    if conv == "neg_errno" and parts[0] in ("int", "ssize"):
        return ctype, "{ return -%s; }" % err
    if conv == "m1":
        if parts[0] == "size":
            return ctype, "{ errno = %s; return static_cast<std::size_t>(-1); }" % err
        if parts[0] in ("int", "ssize", "off"):
            return ctype, "{ errno = %s; return -1; }" % err
    if conv == "zero" and len(parts) == 2:
        return ctype, "{ return 0; }"
    raise ListError("line %d: bad KIND %r" % (s.line, kind))


HEADER = "Generated by scripts/gen_abi_stubs.py from src/verbs/abi_symbols.txt; do not edit."


def gen_map(nodes, syms) -> str:
    compat_nodes = {s.version for s in syms if not s.default}
    # `local: *` must sit in a node without compat (NAME@NODE) symbols: GNU ld
    # matches a .symver'd NAME@NODE against NODE's own patterns, so a
    # `local: *` there would hide the compat symbols.
    local_node = next((n for n, _ in nodes if n not in compat_nodes), None)
    if local_node is None:
        raise ListError("every node has compat symbols; nowhere to put 'local: *'")
    out = [
        "/* %s" % HEADER,
        " *",
        " * The version nodes and default (NAME@@NODE) symbols of Debian 12's",
        " * libibverbs.so.1 and librdmacm.so.1, with the same node inheritance.",
        " * Compat entries (NAME@NODE, non-default) are not listed here: they are",
        " * bound by .symver in the abi_stubs.cc files.  `local: *` sits in %s"
        % local_node,
        " * because ld would apply it to the .symver'd compat symbols of the node",
        " * that carries it. */",
        "",
    ]
    for node, parent in nodes:
        names = sorted(s.name for s in syms if s.version == node and s.default)
        out.append("%s {" % node)
        if names:
            out.append("\tglobal:")
            out.extend("\t\t%s;" % n for n in names)
        if node == local_node:
            out.append("\tlocal: *;")
        out.append("}%s;" % ("" if parent is None else " " + parent))
        out.append("")
    return "\n".join(out)


def gen_stubs(family: str, syms) -> str:
    mine = [s for s in syms if s.family == family]
    defaults = sorted((s for s in mine if s.default), key=lambda s: s.name)
    compats = sorted((s for s in mine if not s.default), key=lambda s: (s.name, s.version))
    lib = LIBNAME[family]
    out = [
        "// %s" % HEADER,
        "// clang-format off",
        "//",
        "// A weak definition of every symbol that Debian 12's %s exports, so" % lib,
        "// that uroce exports exactly the same set (design.md section 2) and nothing",
        "// falls through to the real library when uroce is preloaded.  Each returns",
        "// \"not supported\" in the function's own rdma-core convention (see the KIND",
        "// column of abi_symbols.txt).  A strong definition with the same C name in",
        "// any other source file of the uroce library replaces the stub; it must be",
        "// extern \"C\" and have default visibility (the library is built with",
        "// -fvisibility=hidden, and a hidden strong definition would hide the",
        "// symbol altogether).",
        "//",
        "// The rdma headers are deliberately not included: verbs.h defines macros",
        "// (ibv_reg_mr, ibv_query_port, ...) that clash with these definitions.",
        "// Parameters are omitted; callers' arguments are simply ignored.",
        "",
        "#include <sys/types.h>",
        "",
        "#include <cerrno>",
        "#include <cstddef>",
        "#include <cstdint>",
        "",
        "#define UROCE_ABI_STUB __attribute__((weak, visibility(\"default\")))",
        "#define UROCE_ABI_COMPAT __attribute__((visibility(\"default\")))",
        "",
        "extern \"C\" {",
        "",
        "// ---- default versions (NAME@@NODE), overridable ----",
        "",
    ]
    for s in defaults:
        ctype, body = stub_body(s)
        if s.kind.startswith("data:"):
            out.append("// %s@@%s (data object)" % (s.name, s.version))
            out.append("UROCE_ABI_STUB %s %s = false;" % (body, s.name))
        else:
            out.append("// %s@@%s" % (s.name, s.version))
            out.append("UROCE_ABI_STUB %s() noexcept %s" % (decl(ctype, s.name), body))
    if compats:
        out += [
            "",
            "// ---- compat versions (NAME@NODE, not default) ----",
            "// Legacy ABIs with other struct layouts (IBVERBS_1.0 predates 2006);",
            "// uroce exports them so the real library never serves them, and only",
            "// ever answers \"not supported\".",
            "",
        ]
        for s in compats:
            ctype, body = stub_body(s)
            out.append("// %s@%s" % (s.name, s.version))
            out.append("UROCE_ABI_COMPAT %s() noexcept %s" % (decl(ctype, s.compat_name), body))
            out.append('__asm__(".symver %s, %s@%s");' % (s.compat_name, s.name, s.version))
    out += ["", "}  // extern \"C\"", ""]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="verify outputs are up to date")
    args = ap.parse_args()
    try:
        nodes, syms = parse(LIST)
        outputs = {MAP: gen_map(nodes, syms)}
        for family, path in STUBS.items():
            outputs[path] = gen_stubs(family, syms)
    except ListError as e:
        print("gen_abi_stubs: %s" % e, file=sys.stderr)
        return 2
    stale = []
    for path, text in outputs.items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    rel = [str(p.relative_to(ROOT)) for p in stale]
    if args.check:
        if stale:
            print("gen_abi_stubs: out of date (re-run scripts/gen_abi_stubs.py): %s"
                  % " ".join(rel), file=sys.stderr)
            return 1
        return 0
    n_def = sum(s.default for s in syms)
    print("gen_abi_stubs: %d symbols (%d default, %d compat), %d nodes; wrote %s"
          % (len(syms), n_def, len(syms) - n_def, len(nodes), " ".join(rel) or "nothing"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
