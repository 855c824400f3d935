"""Upstream's on-device Core AI manifest rules, one by one, to hold our manifests to them.

A mirror of ``parse_manifest`` and ``validate_files`` in ExecuTorch main's
``backends/apple/coreai/runtime/coreai_assets.mm`` (the commit the research
notes name; not in executorch 1.5.1), and of the named-data lookups its
``prepare_source_bundle`` makes.  Each refusal carries the rule's number and
upstream's message, so a test can say which rule a manifest breaks.
"""

from __future__ import annotations

import json
from typing import Any

HEX = set("0123456789abcdef")
INT64_MAX = (1 << 63) - 1


class Refused(ValueError):
    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"rule {rule}: {message}")
        self.rule = rule


def _check(ok: bool, rule: str, message: str) -> None:
    if not ok:
        raise Refused(rule, message)


def _nonempty_string(value: Any) -> bool:
    return isinstance(value, str) and len(value) > 0 and "\0" not in value


def _utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _names_array(value: Any) -> bool:
    return isinstance(value, list) and all(map(_nonempty_string, value)) and len(set(value)) == len(value)


def _relative_path(path: Any) -> bool:
    if not _nonempty_string(path) or path.startswith("/") or "\\" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def _file_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT64_MAX


def _parents(path: str):
    while "/" in path:
        path = path.rsplit("/", 1)[0]
        yield path


def _validate_files(files: Any, bundles: set[str]) -> None:
    _check(isinstance(files, dict) and len(files) > 0, "9", "Core AI manifest requires asset file sizes")
    populated = set()
    for file, size in files.items():
        _check(
            _relative_path(file) and _file_size(size) and file.split("/")[0] in bundles and "/" in file and _utf8(file),
            "9a",
            "Invalid Core AI asset path or size",
        )
        populated.add(file.split("/")[0])
        _check(not any(parent in files for parent in _parents(file)), "9b", "Conflicting Core AI asset paths")
    _check(populated == bundles, "9c", "Core AI manifest requires files for every declared bundle")


def _version(value: Any) -> bool:
    if value is None:
        return True
    if not _nonempty_string(value):
        return False
    parts = value.split(".")
    if len(parts) > 3 or any(not part or len(part) > 6 or not part.isascii() or not part.isdigit() for part in parts):
        return False
    return int(parts[0]) > 0


def parse_manifest(payload: bytes) -> dict[str, Any]:
    """The manifest, if upstream's device runtime would accept it; else :class:`Refused` naming the rule."""
    try:
        manifest = json.loads(payload)
    except ValueError:
        manifest = None
    _check(isinstance(manifest, dict), "1", "Invalid Core AI manifest JSON")
    packaging = manifest.get("packaging")
    _check(isinstance(packaging, str), "2", "Missing Core AI packaging")
    _check(
        packaging in ("inline", "aot_compiled_inline"),
        "3",
        "Unsupported Core AI packaging; expected .aimodel or AOT .aimodelc",
    )
    model_hash = manifest.get("hash")
    _check(_nonempty_string(model_hash) and set(model_hash) <= HEX, "4", "Invalid Core AI model hash")
    bundles = set()
    if packaging.startswith("aot_compiled_"):
        _check(_nonempty_string(manifest.get("platform")), "5a", "Core AI AOT manifest requires a target platform")
        archs = manifest.get("archs")
        _check(isinstance(archs, dict) and len(archs) > 0, "5b", "Core AI AOT manifest requires a nonempty architecture map")
        for arch, path in archs.items():
            _check(_relative_path(arch) and "/" not in arch and _utf8(arch), "5c", "Invalid Core AI AOT architecture name")
            bundle = f"model.{arch}.aimodelc"
            _check(
                _relative_path(path) and path == f"{model_hash}/{bundle}",
                "5d",
                f"Invalid Core AI AOT bundle path for architecture {arch}",
            )
            bundles.add(bundle)
    else:
        path = manifest.get("path")
        _check(_relative_path(path) and path == f"{model_hash}/model.aimodel", "6", "Invalid Core AI source bundle path")
        bundles.add("model.aimodel")
    _check(
        _nonempty_string(manifest.get("function"))
        and _names_array(manifest.get("input_names"))
        and _names_array(manifest.get("output_names")),
        "7",
        "Core AI manifest requires ordered input/output names; re-export the model",
    )
    _check(
        "min_deployment_version" in manifest and _version(manifest["min_deployment_version"]),
        "8",
        "Invalid Core AI minimum deployment version",
    )
    _validate_files(manifest.get("files"), bundles)
    digests = manifest.get("bundle_digests")
    _check(
        isinstance(digests, dict) and set(digests) == bundles,
        "10",
        "Core AI bundle digests must exactly cover declared bundles",
    )
    for bundle in bundles:
        digest = digests[bundle]
        _check(
            _nonempty_string(digest) and len(digest) == 64 and set(digest) <= HEX,
            "11",
            "Invalid Core AI exported bundle digest",
        )
    return manifest


def check_named_data(manifest: dict[str, Any], files: dict[str, Any]) -> None:
    """``prepare_source_bundle``'s reads: each listed file, as named data ``coreai/<hash>/<file>``, of its size.

    ``files`` is that named data by path under ``coreai/<hash>/`` (``read_pte``'s ``Delegate.files``).
    """
    for file, size in manifest["files"].items():
        _check(file in files, "prepare", f"Missing selected Core AI named data: coreai/{manifest['hash']}/{file}")
        _check(len(files[file]) == size, "prepare", "Invalid Core AI named data buffer")
