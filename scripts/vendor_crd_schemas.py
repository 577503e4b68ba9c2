"""Vendor the OpenAPI schemas of CustomResourceDefinitions for the offline manifest tests.

    python scripts/vendor_crd_schemas.py CRD.yaml... --out tests/data/crds

Each served version's ``openAPIV3Schema`` is written as ``<group>_<kind>_<version>.json.gz``, without
``description`` texts (they are most of the size and never validate anything).
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any

import yaml


def _without_descriptions(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {key: _without_descriptions(value) for key, value in schema.items() if key != "description"}
    if isinstance(schema, list):
        return [_without_descriptions(value) for value in schema]
    return schema


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("crds", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("tests/data/crds"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.crds:
        crd = yaml.safe_load(path.read_text())
        spec = crd["spec"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            schema = _without_descriptions(version["schema"]["openAPIV3Schema"])
            name = f"{spec['group']}_{spec['names']['kind']}_{version['name']}.json.gz"
            with gzip.open(args.out / name, "wt") as out:
                json.dump(schema, out, sort_keys=True, separators=(",", ":"))
            print(args.out / name)


if __name__ == "__main__":
    main()
