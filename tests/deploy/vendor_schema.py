"""Vendor one CRD's ``openAPIV3Schema`` into ``deploy/schemas/`` with where it came from.

The CRD manifests are the projects' own, published in their repositories at a release tag:

    python tests/deploy/vendor_schema.py CRD.yaml VERSION SOURCE_URL TAG COMMIT > deploy/schemas/NAME.yaml

writes the schema of the CRD's ``VERSION`` (``v1``, ``v1alpha1``) unchanged but for the YAML layout,
under a header naming the file, the tag and the commit (deploy/schemas/README.md lists the commands
that made each file). :func:`load` reads a vendored file back for the tests.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "deploy" / "schemas"

#: (apiVersion, kind) -> the vendored schema file.
FILES = {
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor.monitoring.coreos.com.v1.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule.monitoring.coreos.com.v1.yaml",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.keda.sh.v1alpha1.yaml",
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkerset.leaderworkerset.x-k8s.io.v1.yaml",
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice.serving.kserve.io.v1beta1.yaml",
}


def schema_of(crd: dict[str, Any], version: str) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of one served version of a CustomResourceDefinition."""
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            schema: dict[str, Any] = v["schema"]["openAPIV3Schema"]
            return schema
    raise SystemExit(f"{crd['metadata']['name']} has no version {version!r}")


def vendored_text(crd: dict[str, Any], version: str, source_url: str, tag: str, commit: str) -> str:
    kind = crd["spec"]["names"]["kind"]
    group = crd["spec"]["group"]
    header = [
        f"# openAPIV3Schema of {kind} ({group}/{version}), vendored unchanged (YAML layout aside) from",
        f"#   {source_url}",
        f"#   tag {tag}, commit {commit}",
        "# Read by tests/deploy to validate the rendered manifests offline; regenerate with",
        "# tests/deploy/vendor_schema.py (deploy/schemas/README.md). Not a CRD to apply.",
    ]
    body = yaml.safe_dump(schema_of(crd, version), sort_keys=False, width=1_000_000, allow_unicode=True)
    return "\n".join(header) + "\n" + body


def load(api_version: str, kind: str) -> dict[str, Any]:
    """The vendored schema of ``kind``."""
    text = (SCHEMAS / FILES[(api_version, kind)]).read_text(encoding="utf-8")
    # libyaml's loader when PyYAML has it: the LeaderWorkerSet and InferenceService schemas are 1-1.5 MB.
    schema: dict[str, Any] = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return schema


def main(argv: list[str]) -> int:
    if len(argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    path, version, source_url, tag, commit = argv
    crd = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    sys.stdout.write(vendored_text(crd, version, source_url, tag, commit))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
