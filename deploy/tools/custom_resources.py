"""Custom resources in a rendered overlay. kubernetes-validate knows only Kubernetes' own
kinds; a kind with a schema in deploy/tools/schemas (named <group>_<version>_<Kind>.json, see
its README) is split off before it and checked against that schema here instead. A custom
kind without one stays with kubernetes-validate, which cannot find a schema: a failure.

    python custom_resources.py split RENDERED.yaml BUILTIN.yaml

writes the resources of kinds without a schema here to BUILTIN.yaml and prints their number.
check_manifests.py validates the others (validate below).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

SCHEMAS = Path(__file__).resolve().parent / "schemas"


def schema_file(doc: dict) -> Path:
    group_version = doc.get("apiVersion", "").replace("/", "_")
    return SCHEMAS / f"{group_version}_{doc.get('kind', '')}.json"


def has_schema(doc: dict) -> bool:
    return "/" in doc.get("apiVersion", "") and schema_file(doc).is_file()


def validate(docs: list[dict]) -> list[str]:
    """Every violation of its schema by a resource of a kind with one, as
    `Kind/name: path: message`."""
    import jsonschema  # from the tools' virtual environment (deploy/tools/requirements.txt)

    problems = []
    for doc in docs:
        if not has_schema(doc):
            continue
        schema = json.loads(schema_file(doc).read_text())
        validator = jsonschema.Draft202012Validator(schema)
        where = f"{doc['kind']}/{doc.get('metadata', {}).get('name')}"
        for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
            path = ".".join(str(p) for p in error.absolute_path) or "(top)"
            problems.append(f"{where}: {path}: {error.message} "
                            f"(schema {schema_file(doc).name})")
    return problems


def main() -> int:
    if len(sys.argv) != 4 or sys.argv[1] != "split":
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[2]) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    builtin = [d for d in docs if not has_schema(d)]
    with open(sys.argv[3], "w") as f:
        yaml.safe_dump_all(builtin, f, sort_keys=False)
    print(len(builtin))
    return 0


if __name__ == "__main__":
    sys.exit(main())
