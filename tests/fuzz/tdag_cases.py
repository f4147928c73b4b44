""".tdag cases: saved programs, damaged in their bytes, and edited in their metadata (text
form, weight table, version), their tensors and their safetensors header, with the checksum
computed again so that the damage gets past the integrity check and reaches the parser."""
from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import safetensors
import safetensors.torch
import torch

import tdag
from tdag.ir import serialize

from . import text_cases
from .harness import MARK, Case, CaseDirs, flips, splices, truncations

TEXT, WEIGHTS, SHA = serialize._TEXT, serialize._WEIGHTS, serialize._SHA
FORMAT, VERSION = serialize._FORMAT, serialize._VERSION


def read(path: Path) -> tuple[dict, dict]:
    with safetensors.safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {}), {k: f.get_tensor(k) for k in f.keys()}


def write(path: Path, metadata: dict, tensors: dict, checksum: bool = True) -> bytes:
    """A safetensors file of ``tensors`` and ``metadata``, with a fresh tdag checksum."""
    metadata = dict(metadata)
    if checksum:
        metadata[SHA] = serialize._checksum(metadata, tensors)
    safetensors.torch.save_file(tensors, str(path), metadata=metadata)
    return path.read_bytes()


def seeds(folder: Path, long: bool) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, prog in text_cases.programs(long).items():
        paths[name] = folder / f"{name}.tdag"
        tdag.save(prog, paths[name])
    return paths


# -- the safetensors header -------------------------------------------------------------------

def split(data: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def join(header: dict, body: bytes) -> bytes:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + body


def refresh_checksum(data: bytes, scratch: Path) -> bytes:
    """``data`` with the sha in its header recomputed from what safetensors reads back, if
    safetensors reads it at all (else the damage is left for the loader to find)."""
    scratch.write_bytes(data)
    try:
        metadata, tensors = read(scratch)
        header, body = split(data)
        header["__metadata__"][SHA] = serialize._checksum(metadata, tensors)
    except Exception:
        return data
    return join(header, body)


def header_edit(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    header, body = split(data)
    names = [k for k in header if k != "__metadata__"]
    how = rng.randrange(8) if names else rng.choice((6, 7))
    if how < 6:
        key = rng.choice(names)
        entry = header[key]
        n = 1
        for d in entry["shape"]:
            n *= d
    if how == 0:
        entry["dtype"] = rng.choice(("I32", "F16", "BF16", "I64", "U8", "BOOL", "C64", "F8_E4M3",
                                     "Q7", ""))
    elif how == 1:
        entry["shape"] = rng.choice(([n], [1, n], [n, 1, 1], [], [0], [2**62, 2**62], [-1]))
    elif how == 2:
        lo, hi = entry["data_offsets"]
        entry["data_offsets"] = rng.choice(([hi, lo], [lo, hi + 4], [0, 2**63], [lo, lo],
                                            [-4, hi], [lo, len(body) + 8]))
    elif how == 3:
        header[key + "_twin"] = dict(entry)
    elif how == 4:
        del header[key]
    elif how == 5:
        entry["shape"] = [n] + [1] * 200
    elif how == 6:
        header["__metadata__"] = rng.choice(({"format": 5}, [], None, {SHA: None}))
    else:
        return "header length 2**63", struct.pack("<Q", 2**63) + data[8:]
    return f"header #{how}", join(header, body)


# -- metadata and tensor edits (the checksum recomputed) ----------------------------------------

def _nest(open_: str, close: str, n: int) -> str:
    return open_ * n + close * n


def weight_tables(metadata: dict, tensors: dict, rng: random.Random) -> list[str]:
    table = json.loads(metadata[WEIGHTS])
    keys = sorted(tensors)
    graphs = table.get("graphs", {})
    first = next(iter(graphs), "main")
    some = next(iter(graphs.get(first, {})), "w")
    variants = [
        "[]", "null", "1", '"x"', "{}", '{"graphs": []}', '{"graphs": {"%s": []}}' % first,
        '{"graphs": {"%s": {"%s": 5}}}' % (first, some),
        '{"graphs": {"%s": {"%s": "missing"}}}' % (first, some),
        '{"graphs": {"%s": {"x": "%s"}}}' % (first, keys[0] if keys else "x"),
        '{"graphs": {"nowhere": {"w": "w"}}}', '{"state": {"x": "w"}}', '{"state": []}',
        '{"graphs": {"%s": {"%s": ["a"]}}}' % (first, some), '{"graphs": NaN}', "{",
        '{"graphs": 1e999999}', '"\\ud800"', _nest("[", "]", 100000),
        '{"graphs": ' + _nest("{\"a\": ", "}", 3000).replace("}", "{}}", 1) + "}",
        '{"graphs": {"%s": {"%s": "%s"}}, "graphs": {}}' % (first, some, some),
    ]
    if len(keys) >= 2:  # two weights swapped: each now gets the other's tensor
        swapped = json.loads(metadata[WEIGHTS])
        for g in swapped.get("graphs", {}).values():
            names = list(g)
            if len(names) >= 2:
                g[names[0]], g[names[1]] = g[names[1]], g[names[0]]
        variants.append(json.dumps(swapped))
    return variants


def _utf8(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


def metadata_edits(metadata: dict, tensors: dict, rng: random.Random, marker: str,
                   n_text: int, n_table: int):
    """(label, metadata, tensors) triples."""
    out = []
    for _ in range(n_text):
        label, text = text_cases.mutants(metadata[TEXT], rng, marker, 3)
        out.append((f"text: {label}", dict(metadata, **{TEXT: _utf8(text)}), tensors))
    for table in rng.sample(weight_tables(metadata, tensors, rng), n_table):
        out.append((f"weight table {table[:40]!r}", dict(metadata, **{WEIGHTS: table}), tensors))
    version = rng.choice([(VERSION, "2"), (VERSION, ""), (VERSION, "1\x00"), (FORMAT, "TDAG"),
                          (FORMAT, None), (TEXT, None), (WEIGHTS, None), ("extra", "x")])
    edited = dict(metadata, **{version[0]: version[1]})
    if version[1] is None:
        del edited[version[0]]
    out.append((f"metadata {version}", edited, tensors))
    return out


def tensor_edits(metadata: dict, tensors: dict, rng: random.Random, n: int):
    if not tensors:
        return []
    out = []
    for _ in range(n):
        key = rng.choice(sorted(tensors))
        t = tensors[key]
        edited = dict(tensors)
        how = rng.randrange(7)
        if how == 0:
            edited[key] = t.to(rng.choice((torch.float64, torch.int32, torch.complex64,
                                           torch.uint16, torch.float8_e4m3fn, torch.bool,
                                           torch.int8, torch.float16)))
        elif how == 1:
            edited[key] = t.reshape(-1)[:max(0, t.numel() - 1)].clone()
        elif how == 2:
            edited[key] = t.reshape(-1, 1).clone() if t.numel() else torch.zeros(3)
        elif how == 3:
            del edited[key]
        elif how == 4:
            edited[key + "_extra"] = torch.zeros(2)
        elif how == 5:
            edited[key] = torch.full_like(t, float("nan")) if t.is_floating_point() else t
        else:
            edited["renamed_" + key] = edited.pop(key)
        out.append((f"tensor {key!r} #{how}", metadata, edited))
    return out


# -- all cases --------------------------------------------------------------------------------

def cases(dirs: CaseDirs, seed_dir: Path, seed: int, long: bool) -> list[Case]:
    rng = random.Random(seed)
    k = 5 if long else 1
    out = []
    for name, path in seeds(seed_dir, long).items():
        data = path.read_bytes()
        header_len = struct.unpack("<Q", data[:8])[0] + 8
        mutants = truncations(data, rng, 3 * k) + flips(data, rng, 2 * k)
        mutants += [(f"header {label}", blob) for label, blob in
                    flips(data, rng, 2 * k, most=3, span=(0, header_len))]
        mutants += splices(data, rng, k)
        for label, blob in mutants:
            file, marker = dirs.write("tdag", "m.tdag", blob)
            out.append(Case("tdag", f"{name}: {label}", "tdag_path", str(file), marker))
        for _ in range(3 * k):
            folder = dirs.new("tdag")
            label, blob = header_edit(data, rng)
            file = folder / "m.tdag"
            file.write_bytes(refresh_checksum(blob, folder / "scratch.tdag"))
            out.append(Case("tdag", f"{name}: {label}, checksum redone", "tdag_path",
                            str(file), str(folder / "EXECUTED")))
        metadata, tensors = read(path)
        edits = metadata_edits(metadata, tensors, rng, MARK, 8 * k, 3 * k) + \
            tensor_edits(metadata, tensors, rng, 3 * k)
        for label, md, ts in edits:
            folder = dirs.new("tdag")
            marker = str(folder / "EXECUTED")
            if TEXT in md:
                md = dict(md, **{TEXT: md[TEXT].replace(MARK, marker)})
            file = folder / "m.tdag"
            write(file, md, ts)
            out.append(Case("tdag", f"{name}: {label}, checksum redone", "tdag_path",
                            str(file), marker))
    return out
