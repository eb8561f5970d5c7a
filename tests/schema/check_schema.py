"""Checks `proxops schema` with a JSON Schema implementation nobody here wrote.

The YAML language server validates with a draft-07 validator; this runs python-jsonschema's
Draft7Validator the same way: the schema itself must be a valid draft-07 schema, every
manifest of examples/ and tests/fixtures/valid must pass it, and documents with an unknown
key, a wrong kind or a missing required field must fail it. Prints `N passed, N failed`.
"""

import json
import pathlib
import subprocess
import sys

import jsonschema
import yaml

root = pathlib.Path(__file__).resolve().parents[2]
binary = sys.argv[1] if len(sys.argv) > 1 else str(root / "target/debug/proxops")
schema = json.loads(subprocess.run([binary, "schema"], check=True, capture_output=True).stdout)

passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"PASS {name}")
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


try:
    jsonschema.Draft7Validator.check_schema(schema)
    check("the schema is a valid draft-07 schema", True)
except jsonschema.SchemaError as error:
    check("the schema is a valid draft-07 schema", False, str(error).splitlines()[0])

validator = jsonschema.Draft7Validator(schema)
manifests = sorted((root / "examples").rglob("*.yaml")) + sorted((root / "tests/fixtures/valid").rglob("*.yaml"))
for path in manifests:
    rel = path.relative_to(root)
    if "clusters" in rel.parts:
        continue  # compositions and cluster configs are not manifests
    for index, document in enumerate(yaml.safe_load_all(path.read_text())):
        if document is None:
            continue
        errors = list(validator.iter_errors(document))
        check(f"{rel} (document {index}) is accepted", not errors, errors[0].message if errors else "")

valid_vm = {
    "apiVersion": "proxops/v1alpha1",
    "kind": "VM",
    "metadata": {"name": "web-1"},
    "spec": {"node": "pve1", "vmid": 101, "memory": "2GiB", "cpu": {"type": "host", "cores": 2},
             "disks": [{"storage": "local-lvm", "size": "8GiB"}]},
}
check("a minimal VM is accepted", validator.is_valid(valid_vm))
typo = json.loads(json.dumps(valid_vm))
typo["spec"]["cloud-init-data"] = {"ssh_keys": ["ssh-ed25519 AAAA x"]}
check("an unknown key is refused", not validator.is_valid(typo))
bad_kind = dict(valid_vm, kind="Pod")
check("an unknown kind is refused", not validator.is_valid(bad_kind))
missing = json.loads(json.dumps(valid_vm))
del missing["spec"]["memory"]
check("a missing required field is refused", not validator.is_valid(missing))

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
