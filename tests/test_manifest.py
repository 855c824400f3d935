"""The delegate manifest meets every rule of upstream's on-device runtime (``upstream_manifest``).

Fast tests pin the mirror of upstream's rules (each one refuses a manifest
broken its way) and the bundle digest (upstream's reference vector); slow
ones hold real exports to the rules: the example's ``.pte``, a sidecar
export, and our host runtime refusing what upstream's refuses.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import lower, two_norms
from upstream_manifest import Refused, check_named_data, parse_manifest

from coreai_partitioner.backends.apple_coreai.manifest import bundle_digest, collect_asset_metadata
from coreai_partitioner.backends.apple_coreai.runtime import host
from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte

ROOT = Path(__file__).resolve().parent.parent
HASH = "ab" * 32
GOOD = {
    "packaging": "inline",
    "hash": HASH,
    "path": f"{HASH}/model.aimodel",
    "min_deployment_version": None,
    "version": 2,
    "input_names": ["x"],
    "output_names": ["y"],
    "function": "main",
    "files": {"model.aimodel/main.hash": 32, "model.aimodel/main.mlirb": 10},
    "bundle_digests": {"model.aimodel": "0" * 64},
}
AOT = {"packaging": "aot_compiled_inline", "platform": "iOS", "archs": {"h17": f"{HASH}/model.h17.aimodelc"}}


def changed(**fields):
    manifest = copy.deepcopy(GOOD)
    for key, value in fields.items():
        if value is KeyError:
            del manifest[key]
        else:
            manifest[key] = value
    return manifest


BROKEN = {
    "1 not an object": ("1", []),
    "2 no packaging": ("2", changed(packaging=KeyError)),
    "3 sidecar packaging": ("3", changed(packaging="sidecar")),
    "4 uppercase hash": ("4", changed(hash=HASH.upper())),
    "5a AOT without platform": ("5a", changed(**{**AOT, "platform": ""})),
    "5b AOT without architectures": ("5b", changed(**{**AOT, "archs": {}})),
    "5c AOT architecture with a slash": ("5c", changed(**{**AOT, "archs": {"h/17": f"{HASH}/model.h/17.aimodelc"}})),
    "5d AOT bundle path elsewhere": ("5d", changed(**{**AOT, "archs": {"h17": f"{HASH}/model.h18.aimodelc"}})),
    "6 source path elsewhere": ("6", changed(path=f"{HASH}/../model.aimodel")),
    "7 no function": ("7", changed(function=KeyError)),
    "7 repeated input name": ("7", changed(input_names=["x", "x"])),
    "7 empty output name": ("7", changed(output_names=[""])),
    "8 no minimum version": ("8", changed(min_deployment_version=KeyError)),
    "8 major version 0": ("8", changed(min_deployment_version="0.1")),
    "8 four parts": ("8", changed(min_deployment_version="27.0.0.1")),
    "9 no file sizes": ("9", changed(files={})),
    "9 files as a list": ("9", changed(files=["model.aimodel/main.mlirb"])),
    "9a boolean size": ("9a", changed(files={"model.aimodel/main.mlirb": True})),
    "9a float size": ("9a", changed(files={"model.aimodel/main.mlirb": 10.0})),
    "9a negative size": ("9a", changed(files={"model.aimodel/main.mlirb": -1})),
    "9a file outside the bundle": ("9a", changed(files={"initial_state/x.bin": 4, "model.aimodel/main.mlirb": 10})),
    "9a bundle as a file": ("9a", changed(files={"model.aimodel": 10})),
    "9a dot-dot": ("9a", changed(files={"model.aimodel/../main.mlirb": 10})),
    "9b a file inside a file": ("9b", changed(files={"model.aimodel/a": 1, "model.aimodel/a/b": 1})),
    "9c a bundle without files": (
        "9c",
        changed(**{**AOT, "archs": {"h16": f"{HASH}/model.h16.aimodelc", "h17": f"{HASH}/model.h17.aimodelc"}},
                files={"model.h17.aimodelc/model.bin": 3}, bundle_digests={"model.h17.aimodelc": "0" * 64}),
    ),
    "10 no digests": ("10", changed(bundle_digests={})),
    "10 a digest for no bundle": ("10", changed(bundle_digests={"model.aimodel": "0" * 64, "other": "0" * 64})),
    "11 uppercase digest": ("11", changed(bundle_digests={"model.aimodel": "A" * 64})),
    "11 short digest": ("11", changed(bundle_digests={"model.aimodel": "0" * 63})),
}


def test_upstream_rules_accept_a_well_formed_manifest():
    assert parse_manifest(json.dumps(GOOD).encode()) == GOOD


@pytest.mark.parametrize("rule, manifest", BROKEN.values(), ids=BROKEN.keys())
def test_each_upstream_rule_refuses_a_manifest_broken_its_way(rule, manifest):
    with pytest.raises(Refused) as refused:
        parse_manifest(json.dumps(manifest).encode())
    assert refused.value.rule == rule


UPSTREAM_REFERENCE = {  # upstream's test_asset_manifest.py, test_reference_framing_unicode_order_binary_and_empty_file
    "model.aimodel/\U00010000": b"supplementary",
    "model.aimodel/\ue000": b"private",
    "model.aimodel/\u03a9": b"unicode",
    "model.aimodel/z.bin": b"\x00\xff\x80\x01\x00",
    "model.aimodel/a/empty": b"",
}


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for relative, data in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(data)


def test_bundle_digest_is_upstreams_reference_digest_in_utf8_order(tmp_path):
    write_tree(tmp_path, UPSTREAM_REFERENCE)
    metadata = collect_asset_metadata(tmp_path, GOOD)
    assert metadata["bundle_digests"] == {
        "model.aimodel": "dd400f4c64ae3aa90e66a0f82732c2f56882feff204c2189ba1b3a12723047d2"
    }
    assert list(metadata["files"]) == sorted(UPSTREAM_REFERENCE, key=lambda name: name.encode("utf-8"))
    assert metadata["files"]["model.aimodel/a/empty"] == 0 and metadata["version"] == 2


def test_asset_metadata_refuses_a_root_with_more_than_its_bundles_and_symlinks(tmp_path):
    write_tree(tmp_path, {"model.aimodel/main.mlirb": b"x", "initial_state/s.bin": b"y"})
    with pytest.raises(ValueError, match="exactly the declared bundles"):
        collect_asset_metadata(tmp_path, GOOD)
    (tmp_path / "initial_state" / "s.bin").unlink()
    (tmp_path / "initial_state").rmdir()
    (tmp_path / "model.aimodel" / "link").symlink_to(tmp_path / "model.aimodel" / "main.mlirb")
    with pytest.raises(ValueError, match="reject symlinks"):
        collect_asset_metadata(tmp_path, GOOD)


def assert_meets_upstreams_rules(delegate) -> None:
    manifest = parse_manifest(delegate.payload)
    check_named_data(manifest, delegate.files)
    shipped = [(path, size, [delegate.files[path]]) for path, size in manifest["files"].items()]
    assert bundle_digest(shipped) == manifest["bundle_digests"]["model.aimodel"]


@pytest.mark.slow
def test_the_example_transformer_prints_only_its_own_lines_and_its_pte_meets_every_upstream_manifest_rule(tmp_path):
    out = tmp_path / "tiny_transformer.pte"
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "export_transformer.py"), "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr == "" and "ODIE" not in run.stdout  # coreai-core's "Loading function" line is held down
    assert run.stdout.splitlines()[-1] == "ok"
    (delegate,) = read_pte(out).coreai_delegates()
    assert_meets_upstreams_rules(delegate)


@pytest.mark.slow
def test_a_sidecar_export_meets_every_rule_but_upstreams_refusal_of_sidecars(tmp_path):
    from executorch.backends.apple.coreai import coreai_sidecar_dir

    _, _, ep, records = two_norms()
    with coreai_sidecar_dir(str(tmp_path)):
        (delegate,) = read_pte(lower(ep, records, uses_sidecar=True).to_executorch().buffer).coreai_delegates()
    with pytest.raises(Refused) as refused:
        parse_manifest(delegate.payload)
    assert refused.value.rule == "3"
    manifest = parse_manifest(json.dumps({**delegate.manifest, "packaging": "inline"}).encode())
    metadata = collect_asset_metadata(tmp_path / manifest["hash"], manifest)  # its tree, recomputed
    assert metadata == {key: manifest[key] for key in ("version", "files", "bundle_digests")}


def with_manifest(pte: bytes, manifest: dict) -> bytes:
    """The .pte with its one delegate's manifest replaced, padded to the same length (JSON allows the spaces)."""
    (delegate,) = read_pte(pte).coreai_delegates()
    text = json.dumps(manifest, separators=(",", ":")).encode()
    assert len(text) <= len(delegate.payload) and pte.count(delegate.payload) == 1
    return pte.replace(delegate.payload, text + b" " * (len(delegate.payload) - len(text)))


REFUSED_BY_BOTH = {
    "uppercase digest": (lambda m: {**m, "bundle_digests": {"model.aimodel": m["bundle_digests"]["model.aimodel"].upper()}},
                         "bundle_digests must give"),
    "no minimum version": (lambda m: {k: v for k, v in m.items() if k != "min_deployment_version"},
                           "invalid minimum deployment version"),
    "files as a list": (lambda m: {**m, "files": list(m["files"])}, "requires asset file sizes"),
    "a file of the wrong size": (lambda m: {**m, "files": {**m["files"], "model.aimodel/main.hash": 31}},
                                 "its manifest says 31"),
    "repeated input name": (lambda m: {**m, "input_names": m["input_names"] * 2}, "ordered input/output names"),
}


@pytest.fixture(scope="module")
def two_norms_pte() -> bytes:
    _, _, ep, records = two_norms()
    return lower(ep, records).to_executorch().buffer


@pytest.mark.slow
@pytest.mark.parametrize("change, message", REFUSED_BY_BOTH.values(), ids=REFUSED_BY_BOTH.keys())
def test_the_host_runtime_refuses_what_upstreams_runtime_refuses(two_norms_pte, change, message):
    (delegate,) = read_pte(two_norms_pte).coreai_delegates()
    manifest = change(delegate.manifest)
    with pytest.raises(Refused):
        check_named_data(parse_manifest(json.dumps(manifest).encode()), delegate.files)
    with pytest.raises(RuntimeError, match=message):
        host.load_program(with_manifest(two_norms_pte, manifest))


@pytest.mark.slow
def test_a_manifest_without_version_2_is_refused_here_with_the_fix(two_norms_pte):
    manifest = read_pte(two_norms_pte).coreai_delegates()[0].manifest
    older = with_manifest(two_norms_pte, {k: v for k, v in manifest.items() if k != "version"})
    with pytest.raises(RuntimeError, match="not version 2.*written by an older exporter.*re-export the model"):
        host.load_program(older)


@pytest.mark.slow
def test_a_changed_initial_state_value_is_refused_by_its_sha256():
    from test_host_runtime import stateful_pte

    _, pte = stateful_pte(torch.randn(1, 8, 8))
    (delegate,) = read_pte(pte).coreai_delegates()
    (entry,) = delegate.manifest["initial_state"].values()
    value = bytes(delegate.files[entry["file"]])
    changed_value = pte.replace(value, value[:-1] + bytes([value[-1] ^ 1]))
    with pytest.raises(RuntimeError, match="does not match its sha256"):
        host.load_program(changed_value)
