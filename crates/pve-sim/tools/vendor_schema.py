#!/usr/bin/env python3
"""Vendor the parameter schema that proxops-pve-sim validates requests against.

Reads the PVE 9.1 API subset (../shared/pve-api/pve-api-subset.json, see its
PROVENANCE.md) plus a fixed list of extra endpoints (EXTRA_ENDPOINTS) from the
full schema tree of the same dump (../shared/pve-api/apidoc-full.json), and
writes crates/pve-sim/schema/pve-params.json: for every endpoint path and HTTP
method, the facts JSONSchema.pm checks (type, optional, format, enum, pattern,
limits, requires, property-string keys), the method's permission check
(`permissions.check` / `permissions.user`) and nothing else -- no description,
verbose_description, typetext or format_description.

Usage (from anywhere; paths default relative to the repository root):
  python3 crates/pve-sim/tools/vendor_schema.py [SUBSET_JSON] [--full FULL_JSON] [--out OUT_JSON]

Standard library only. The output is deterministic: sorted keys, indent 1,
UTF-8, trailing newline; re-running on the same input is byte-identical.
"""
import argparse
import json
import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_SUBSET = REPO_ROOT / ".." / "shared" / "pve-api" / "pve-api-subset.json"
DEFAULT_FULL = REPO_ROOT / ".." / "shared" / "pve-api" / "apidoc-full.json"
DEFAULT_OUT = REPO_ROOT / "crates" / "pve-sim" / "schema" / "pve-params.json"

# Schema keys JSONSchema.pm's check_prop/check_object and parse_property_string
# act on, plus `default` (a fact the simulator's handlers use). Everything else
# (description, verbose_description, typetext, format_description, ...) is
# documentation and is dropped.
KEPT_KEYS = {
    "type", "optional", "format", "default", "enum", "pattern", "minimum",
    "maximum", "minLength", "maxLength", "requires", "alias", "keyAlias",
    "default_key", "items",
}
# PVE writes these flags as 0/1; the vendored copy uses JSON booleans.
BOOL_KEYS = {"optional", "default_key"}
NUMERIC_KEYS = {"minimum", "maximum", "minLength", "maxLength"}

# Hash (property-string) formats that the dump only names. Their key
# definitions come from the hand-transcribed named_formats section.
NAMED_PROPERTY_STRING_FORMATS = ["pve-qm-ipconfig", "pve-qm-cicustom", "pve-qm-boot"]

# Endpoints the simulator serves (issue 3, item 3) that pve-api-subset.json
# lacks. They are taken from apidoc-full.json, which is the whole tree of the
# same dump (pve-docs a8736b6d, PVE 9.1); the endpoints the two files share
# are identical there. Every other endpoint of issue 3's list is in the subset.
# The script fails if one of these is missing from the full tree or is already
# in the subset (then it no longer belongs here).
EXTRA_ENDPOINTS = [
    ("/access/permissions", "GET"),
    ("/cluster/status", "GET"),
    # `proxops check` lists each node's bridges (issue 7).
    ("/nodes/{node}/network", "GET"),
    # `proxops check` reads the datacenter tag settings (issue 15, M26).
    ("/cluster/options", "GET"),
    # The agent reads a storage's `path` to write cloud-init snippets (issue 21).
    ("/storage/{storage}", "GET"),
    # Snapshots before risky updates and `proxops rollback` (issue 19).
    ("/nodes/{node}/qemu/{vmid}/snapshot", "GET"),
    ("/nodes/{node}/qemu/{vmid}/snapshot", "POST"),
    ("/nodes/{node}/qemu/{vmid}/snapshot/{snapname}", "DELETE"),
    ("/nodes/{node}/qemu/{vmid}/snapshot/{snapname}/rollback", "POST"),
    ("/nodes/{node}/qemu/{vmid}/feature", "GET"),
    ("/nodes/{node}/lxc/{vmid}/snapshot", "GET"),
    ("/nodes/{node}/lxc/{vmid}/snapshot", "POST"),
    ("/nodes/{node}/lxc/{vmid}/snapshot/{snapname}", "DELETE"),
    ("/nodes/{node}/lxc/{vmid}/snapshot/{snapname}/rollback", "POST"),
    ("/nodes/{node}/lxc/{vmid}/feature", "GET"),
    # Backup before a prune delete (issue 19, item 3).
    ("/nodes/{node}/vzdump", "POST"),
    # A node in PVE's HA maintenance gets no writes (issue 19, item 6).
    ("/cluster/ha/status/current", "GET"),
]


def die(msg):
    print(f"vendor_schema.py: {msg}", file=sys.stderr)
    sys.exit(1)


def number(value, where):
    """Numeric limits sometimes arrive as strings ('0'); store them as numbers."""
    if isinstance(value, bool):
        die(f"{where}: boolean where a number was expected")
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            try:
                return float(value)
            except ValueError:
                die(f"{where}: not a number: {value!r}")
    die(f"{where}: not a number: {value!r}")


def clean_prop(prop, where):
    """Facts-only copy of one property schema (recursing into inline formats)."""
    if not isinstance(prop, dict):
        die(f"{where}: property schema is not an object")
    out = {}
    for key, value in prop.items():
        if key not in KEPT_KEYS:
            continue
        if value is None:
            # e.g. download-url 'compression' has "enum": null: no constraint.
            continue
        if key in BOOL_KEYS:
            value = bool(value)
        elif key in NUMERIC_KEYS:
            value = number(value, f"{where}.{key}")
        elif key == "format" and isinstance(value, dict):
            value = clean_format(value, where)
        elif key == "items":
            value = clean_prop(value, f"{where}[]")
        elif key == "requires" and not isinstance(value, str):
            die(f"{where}: only string 'requires' is supported")
        out[key] = value
    if "optional" in out and not out["optional"]:
        del out["optional"]
    if "default_key" in out and not out["default_key"]:
        del out["default_key"]
    return out


def clean_format(fmt, where):
    return {k: clean_prop(v, f"{where}.{k}") for k, v in fmt.items()}


def permissions(perms, where):
    """The facts of a method's `permissions`: the `check` expression rest_handler evaluates
    (check_api2_permissions) and `user` (`all`, `world`); the description is dropped."""
    if perms is None:
        return None
    if not isinstance(perms, dict):
        die(f"{where}: permissions is not an object")
    out = {k: perms[k] for k in ("check", "user") if k in perms}
    return out or None


def family(path):
    for fam in ("qemu", "lxc"):
        if path == f"/nodes/{{node}}/{fam}" or path.startswith(f"/nodes/{{node}}/{fam}/"):
            return fam
    return None


def full_tree_endpoints(full):
    """(path, method) -> method schema, for every node of apidoc-full.json's tree."""
    found = {}
    stack = list(full)
    while stack:
        node = stack.pop()
        for method, info in (node.get("info") or {}).items():
            found[(node["path"], method)] = info
        stack.extend(node.get("children") or [])
    return found


def extra_endpoints(subset, full):
    """The EXTRA_ENDPOINTS, in the subset's endpoint shape (path, method, schema keys)."""
    in_subset = {(ep["path"], ep["method"]) for ep in subset["endpoints"]}
    tree = full_tree_endpoints(full)
    out = []
    for path, method in EXTRA_ENDPOINTS:
        if (path, method) in in_subset:
            die(f"{method} {path}: already in the subset; drop it from EXTRA_ENDPOINTS")
        info = tree.get((path, method))
        if info is None:
            die(f"{method} {path}: not in the full schema")
        out.append({"path": path, "method": method, **info})
    return out


def vendor(subset, full):
    ranges = subset.get("indexed_option_ranges", {})
    endpoints = {}
    for ep in subset["endpoints"] + extra_endpoints(subset, full):
        path, method = ep["path"], ep["method"]
        where = f"{method} {path}"
        params = ep.get("parameters") or {}
        props = {}
        for name, prop in sorted((params.get("properties") or {}).items()):
            clean = clean_prop(prop, f"{where} {name}")
            if name.endswith("[n]"):
                fam = family(path)
                rng = ranges.get(fam, {}).get(name) if fam else None
                if not (isinstance(rng, list) and len(rng) == 2):
                    die(f"{where}: indexed option {name} has no index range")
                clean["index_range"] = [int(rng[0]), int(rng[1])]
            props[name] = clean
        entry = {
            # JSONSchema.pm: additionalProperties undefined or true lets unknown
            # parameters through; only an explicit 0 rejects them.
            "additionalProperties": bool(params.get("additionalProperties", 1)),
            # JSONSchema.pm method schema: allowtoken defaults to 1.
            "allowtoken": bool(ep.get("allowtoken", 1)),
            "protected": bool(ep.get("protected", 0)),
            "parameters": props,
        }
        if ep.get("proxyto"):
            entry["proxyto"] = ep["proxyto"]
        perms = permissions(ep.get("permissions"), where)
        if perms is not None:
            entry["permissions"] = perms
        if method in endpoints.get(path, {}):
            die(f"{where}: duplicate endpoint")
        endpoints.setdefault(path, {})[method] = entry

    named = subset.get("named_formats", {})
    prop_formats = {}
    for name in NAMED_PROPERTY_STRING_FORMATS:
        spec = named.get(name, {}).get("property_string")
        if not isinstance(spec, dict):
            die(f"named format {name} has no property_string definition")
        prop_formats[name] = clean_format(spec, name)
    # 'pve-qm-ide' (used by 'cdrom') is qemu-server's $ide_fmt: the ide[n]
    # drive format without the API-only 'import-from' key.
    ide = subset["property_formats"]["qemu.ide[n]"]["schema"]["format"]
    prop_formats["pve-qm-ide"] = clean_format(
        {k: v for k, v in ide.items() if k != "import-from"}, "pve-qm-ide")

    meta = subset.get("_meta", {})
    return {
        "_origin": {
            "generator": "crates/pve-sim/tools/vendor_schema.py",
            "extra_endpoints_from_full": [f"{m} {p}" for p, m in EXTRA_ENDPOINTS],
            "inputs": [
                "../shared/pve-api/pve-api-subset.json (see ../shared/pve-api/PROVENANCE.md)",
                "../shared/pve-api/apidoc-full.json (extra_endpoints_from_full only)",
            ],
            "licence": meta.get("licence"),
            "pve_docs_version": meta.get("pve_docs_version"),
            "source_commit": meta.get("source_commit"),
            "source_path": meta.get("source_path"),
            "source_repo": meta.get("source_repo"),
        },
        "endpoints": endpoints,
        "property_string_formats": prop_formats,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("subset", nargs="?", default=str(DEFAULT_SUBSET))
    ap.add_argument("--full", default=str(DEFAULT_FULL))
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args()
    with open(args.subset, encoding="utf-8") as fh:
        subset = json.load(fh)
    with open(args.full, encoding="utf-8") as fh:
        full = json.load(fh)
    if not isinstance(full, list):
        die(f"{args.full}: expected the schema tree (a JSON array)")
    out = vendor(subset, full)
    text = json.dumps(out, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    with open(args.out, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)


if __name__ == "__main__":
    main()
