"""Generates onnxruntime's slot and member tables from an onnxruntime checkout.

``OrtApi``, ``OrtEpApi`` and ``OrtModelEditorApi`` are tables of function pointers addressed by
index, and ``OrtEp`` / ``OrtEpFactory`` are structs whose members onnxruntime reads only up to the
version a plugin declares. Counting slots by hand goes wrong, so this script reads onnxruntime's
own text and writes the facts:

- ``api_table.py``: the initializers ``ort_api_1_to_N`` (``onnxruntime/core/session/onnxruntime_c_api.cc``),
  ``ort_ep_api`` (``onnxruntime/core/session/plugin_ep/ep_api.cc``) and ``ort_model_editor_api``
  (``onnxruntime/core/session/model_editor_c_api.cc``), entries numbered in order, each with the API
  version it shipped in (the "End of Version N" markers); every ``static_assert(offsetof(...) /
  sizeof(void*) == K)`` anchor of the source is checked against that numbering;
- ``ep_struct_table.py``: the members of ``OrtEp``, ``OrtEpFactory`` and ``OrtEpApi`` in the order
  of ``include/onnxruntime/core/session/onnxruntime_ep_c_api.h``, each with the version of its
  ``\\since Version 1.N`` note; ``OrtEpApi``'s order must equal ``ep_api.cc``'s.

Any mismatch stops it. Run: ``python -m onnxhal.ort_plugin.gen_api_table /path/to/onnxruntime``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SESSION = Path("onnxruntime/core/session")
SOURCES = {"ORT_API": (SESSION / "onnxruntime_c_api.cc", "OrtApis", "OrtApi"),
           "EP_API": (SESSION / "plugin_ep" / "ep_api.cc", "OrtExecutionProviderApi", "OrtEpApi"),
           "MODEL_EDITOR_API": (SESSION / "model_editor_c_api.cc", "OrtModelEditorAPI", "OrtModelEditorApi")}
EP_HEADER = Path("include/onnxruntime/core/session/onnxruntime_ep_c_api.h")
#: The version of entries a source lists before any "End of Version" marker appears in it.
UNMARKED_VERSION = {"OrtModelEditorApi": 21}
_ENTRY = r"^\s*&{ns}::(\w+),"
_MARKER = re.compile(r"End of Version (\d+)")
_ANCHOR = r"offsetof\({struct},\s*(\w+)\)\s*/\s*sizeof\(void\*\)\s*==\s*(\d+)"
_SINCE = re.compile(r"\\since Version 1\.(\d+)")
_MEMBER = re.compile(r"ORT_API_T\(\s*[^,]+,\s*(\w+)\s*,|ORT_API2_STATUS\(\s*(\w+)\s*,|ORT_CLASS_RELEASE\(\s*(\w+)\s*\)"
                     r"|\(\s*ORT_API_CALL\s*\*\s*(\w+)\s*\)")


def parse_table(text: str, namespace: str, struct: str) -> dict[str, tuple[int, int]]:
    """{function name: (slot index, API version it shipped in)}, anchors checked."""
    entry = re.compile(_ENTRY.format(ns=namespace))
    names: list[str] = []
    versions: list[int] = []
    pending = 0  # entries since the last version marker
    for line in text.splitlines():
        m = entry.match(line)
        if m:
            names.append(m.group(1))
            pending += 1
            continue
        mark = _MARKER.search(line)
        if mark:
            versions.extend([int(mark.group(1))] * pending)
            pending = 0
    if _MARKER.search(text):
        versions.extend([int(_MARKER.findall(text)[-1]) + 1] * pending)  # after the last marker: in development
    else:
        versions.extend([UNMARKED_VERSION[struct]] * pending)
    if len(set(names)) != len(names):
        raise SystemExit(f"{struct}: duplicate entries in the source text")
    table = {n: (i, v) for i, (n, v) in enumerate(zip(names, versions))}
    anchors = re.findall(_ANCHOR.format(struct=struct), text)
    if not anchors:
        raise SystemExit(f"{struct}: no static_assert anchors found; the source text is incomplete")
    for name, index in anchors:
        if name not in table or table[name][0] != int(index):
            raise SystemExit(f"{struct}: anchor {name} is slot {index} in onnxruntime, "
                             f"{table.get(name, ('missing',))[0]} by this count: the source text is wrong")
    return table


def parse_struct(header: str, struct: str) -> list[tuple[str, int | None]]:
    """[(member, API version of its ``\\since`` note)] of ``struct {...}`` in the header, in order. A
    member without a note (``ORT_CLASS_RELEASE``) takes the version of the member before it."""
    start = re.search(rf"^struct {struct} {{$", header, re.M)
    if start is None:
        raise SystemExit(f"{EP_HEADER.name}: no 'struct {struct} {{' found")
    end = header.index("\n};", start.end())
    members: list[tuple[str, int | None]] = []
    since: int | None = None
    for piece in re.split(r"(/\*\*.*?\*/)", header[start.end():end], flags=re.S):
        if piece.startswith("/**"):
            note = _SINCE.search(piece)
            since = int(note.group(1)) if note else None
            continue
        for m in _MEMBER.finditer(piece):
            name = m.group(1) or m.group(2) or (m.group(3) and "Release" + m.group(3)) or m.group(4)
            if since is None and m.group(3) and members:
                since = members[-1][1]
            members.append((name, since))
            since = None
    if not members:
        raise SystemExit(f"{EP_HEADER.name}: struct {struct} has no members this script recognises")
    return members


def render_api_table(tables: dict[str, dict[str, tuple[int, int]]]) -> str:
    lines = ['"""OrtApi / OrtEpApi / OrtModelEditorApi slot indices and the API version each slot shipped in.',
             "",
             "Facts read from onnxruntime's source (the initializers of onnxruntime_c_api.cc, plugin_ep/ep_api.cc",
             "and model_editor_c_api.cc, microsoft/onnxruntime) by gen_api_table.py; do not edit.",
             '"""', "", "# name: (slot index, API version)"]
    for var, table in tables.items():
        lines.append(f"{var}: dict[str, tuple[int, int]] = {{")
        lines += [f"    {name!r}: ({i}, {v})," for name, (i, v) in table.items()]
        lines.append("}")
        lines.append("")
    return "\n".join(lines)


def render_struct_table(newest: int, structs: dict[str, list[tuple[str, int | None]]]) -> str:
    lines = ['"""Member order of onnxruntime\'s plugin structs and the API version each member arrived in.',
             "",
             "Facts read from onnxruntime's header include/onnxruntime/core/session/onnxruntime_ep_c_api.h",
             "(microsoft/onnxruntime: member order and each member's \\\\since note) by gen_api_table.py; do not edit.",
             '"""', "", "#: The newest API version these tables describe completely.", f"NEWEST_VERSION = {newest}", ""]
    for var, members in structs.items():
        kind = "int" if var == "ORT_EP_API" else "int | None"
        lines.append(f"{var}: list[tuple[str, {kind}]] = [")
        lines += [f'    ("{name}", {since}),' for name, since in members]
        lines.append("]")
        lines.append("")
    return "\n".join(lines)


def generate(checkout: Path) -> tuple[str, str]:
    """(api_table.py, ep_struct_table.py) as made from the onnxruntime checkout at ``checkout``."""
    tables = {var: parse_table((checkout / path).read_text(), ns, struct) for var, (path, ns, struct) in SOURCES.items()}
    header = (checkout / EP_HEADER).read_text()
    structs = {"ORT_EP": parse_struct(header, "OrtEp"), "ORT_EP_FACTORY": parse_struct(header, "OrtEpFactory"),
               "ORT_EP_API": parse_struct(header, "OrtEpApi")}
    if [name for name, _ in structs["ORT_EP_API"]] != list(tables["EP_API"]):
        raise SystemExit("OrtEpApi: the header's member order differs from ep_api.cc's initializer")
    structs["ORT_EP_API"] = [(name, since if since is not None else tables["EP_API"][name][1])
                             for name, since in structs["ORT_EP_API"]]
    api_version = re.search(r"#define ORT_API_VERSION (\d+)",
                            (checkout / EP_HEADER.with_name("onnxruntime_c_api.h")).read_text())
    if api_version is None:
        raise SystemExit("onnxruntime_c_api.h: no '#define ORT_API_VERSION N' found")
    return render_api_table(tables), render_struct_table(int(api_version.group(1)), structs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="an onnxruntime source checkout (git clone of microsoft/onnxruntime)")
    args = parser.parse_args(argv)
    api_table, struct_table = generate(args.checkout)
    (HERE / "api_table.py").write_text(api_table)
    (HERE / "ep_struct_table.py").write_text(struct_table)
    print(f"api_table.py and ep_struct_table.py written from {args.checkout}; anchors checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
